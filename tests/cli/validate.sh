#!/usr/bin/env bash
# ftplan validate (issue 11, item 6): the published suite runs, its guards hold (a change that makes
# predictions worse fails here), --json has the contract's keys, --source filters, and a guard
# tightened below today's accuracy makes it exit 1 naming the source.
# Usage: bash validate.sh <path-to-ftplan>
SCRIPT=validate.sh
source "$(dirname "$0")/lib/harness.sh"

"$FTPLAN" validate >"$TMP/out" 2>"$TMP/err"
rc=$?
[ $rc -eq 0 ] || fail "ftplan validate: exit $rc, the guards must hold: $(tail -5 "$TMP/out") $(cat "$TMP/err")"
grep -q "guards held" "$TMP/out" || fail "validate does not report its guards: $(tail -3 "$TMP/out")"

"$FTPLAN" validate --json >"$TMP/v.json" || fail "validate --json: exit $?"
out=$(python3 - "$TMP/v.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
problems = []
for key in ("cases", "sources", "overall", "thresholds", "goals_met", "passed", "guards_exceeded"):
    if key not in d: problems.append("missing " + key)
scored = [c for c in d["cases"] if c["scored"]]
if len(scored) < 40: problems.append(f"{len(scored)} scored cases, expected >= 40")
if len({c["source"] for c in scored}) < 6: problems.append("fewer than 6 sources")
for c in scored:
    if c["measured_bytes"] is not None and not c["measured_oom"] and c["error_pct"] is None:
        problems.append(c["id"] + ": no error")
    if c["predicted_bytes"] is None or c["predicted_bytes"] <= 0: problems.append(c["id"] + ": no prediction")
if not any(c["oom_boundary"] for c in scored): problems.append("no OOM-boundary case scored")
print("; ".join(problems))
sys.exit(1 if problems else 0)
PY
) || fail "validate --json: $out"

"$FTPLAN" validate --source litgpt-resource-tables --json >"$TMP/one.json" || fail "validate --source: exit $?"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); s={c["source"] for c in d["cases"]}; sys.exit(0 if s == {"litgpt-resource-tables"} else 1)' \
  "$TMP/one.json" || fail "validate --source did not keep one source's cases"
"$FTPLAN" validate --source no-such-source >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--source" "$TMP/err" || fail "validate --source no-such-source: exit $rc: $(cat "$TMP/err")"

# A guard below today's accuracy: exit 1, naming the source.
python3 - "$FTPLAN_DATA_DIR/configs/validation/published.json" "$TMP/tight.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["guards"]["sources"]["litgpt-resource-tables"]["memory_mape_pct"] = 0.01
json.dump(d, open(sys.argv[2], "w"))
PY
"$FTPLAN" validate --suite "$TMP/tight.json" >"$TMP/out" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "litgpt-resource-tables: memory MAPE" "$TMP/out" ||
  fail "a tightened guard: exit $rc, expected 1 naming the source: $(tail -4 "$TMP/out")"

if [ "$failures" -ne 0 ]; then
  echo "validate.sh: $failures check(s) failed"
  exit 1
fi
echo "validate.sh: all checks passed"
