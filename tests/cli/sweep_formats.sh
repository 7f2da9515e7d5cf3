#!/usr/bin/env bash
# ftplan sweep (issue 3, item 6): the same rows as CSV, Markdown and JSON, and --cheapest /
# --fastest printing one row. Usage: bash sweep_formats.sh <path-to-ftplan>
SCRIPT=sweep_formats.sh
source "$(dirname "$0")/lib/harness.sh"

JOB="$FTPLAN_DATA_DIR/configs/jobs/tinyllama-lora-4x-rtx6000ada.json"
SWEEP=(sweep "$JOB" --gpu-types a100-80gb-sxm,rtx-4090,l4 --gpu-counts 1,2,4)

sweep() {  # name, extra args...: stdout in $TMP/<name>
  local name=$1
  shift
  "$FTPLAN" "${SWEEP[@]}" "$@" >"$TMP/$name" 2>"$TMP/$name.err"
  local rc=$?
  [ "$rc" -eq 0 ] || fail "sweep $*: exit code $rc: $(cat "$TMP/$name.err")"
}

sweep csv --format csv
sweep md --format markdown
sweep json --format json
sweep table

# CSV: the header, then rows with as many fields as the header.
header="gpu,gpus,strategy,micro_batch,checkpointing,memory_GiB,step_time_s,tokens_per_s,mfu_pct,job_time,job_time_s,cost_usd"
[ "$(head -n 1 "$TMP/csv")" = "$header" ] || fail "CSV header is '$(head -n 1 "$TMP/csv")', expected '$header'"
csv_rows=$(($(wc -l <"$TMP/csv") - 1))
[ "$csv_rows" -ge 3 ] || fail "CSV has $csv_rows rows, expected several"
# A composition's name holds commas ("cp=2,dp_shard=2"): fields are RFC 4180 quoted, read with Python's csv.
bad=$(python3 -c 'import csv,sys; print("\n".join(",".join(r) for r in list(csv.reader(open(sys.argv[1])))[1:] if len(r) != 12)[:400])' "$TMP/csv")
[ -z "$bad" ] || fail "CSV rows without 12 fields: $bad"
awk -F, 'NR > 1 && $1 != "a100-80gb-sxm" && $1 != "rtx-4090" && $1 != "l4" {exit 1}' "$TMP/csv" ||
  fail "CSV has a GPU outside --gpu-types"

# Markdown: a pipe table with a separator row and the same number of rows as the CSV.
head -n 1 "$TMP/md" | grep -qE '^\| gpu \| gpus \| strategy \|' || fail "Markdown header: $(head -n 1 "$TMP/md")"
sed -n 2p "$TMP/md" | grep -qE '^\|( --- \|)+$' || fail "Markdown separator row: $(sed -n 2p "$TMP/md")"
md_rows=$(($(grep -c '^|' "$TMP/md") - 2))
[ "$md_rows" -eq "$csv_rows" ] || fail "Markdown has $md_rows rows, CSV $csv_rows"
bad=$(grep '^|' "$TMP/md" | awk -F'|' 'NF != 14' | head -n 3)
[ -z "$bad" ] || fail "Markdown rows without 12 cells: $bad"

# JSON: an array of the same rows, sorted by the objective (time: job_time_s ascending).
out=$(python3 - "$TMP/json" "$csv_rows" <<'PY'
import json, sys
problems = []
rows = json.load(open(sys.argv[1]))
if not isinstance(rows, list):
    print("not a JSON array"); sys.exit(1)
if len(rows) != int(sys.argv[2]):
    problems.append(f"{len(rows)} rows, CSV has {sys.argv[2]}")
for r in rows:
    for key in ("gpu", "gpus", "name", "micro_batch", "step_time_s", "job_time_s", "cost_usd", "fits"):
        if key not in r:
            problems.append(f"row without {key}: {sorted(r)[:8]}")
            break
times = [r.get("job_time_s", 0) for r in rows]
# Sorted by job time, except that plans within 0.5% of each other may be reordered to put the
# simpler strategy first (the same tie rule as ftplan plan): no row may be more than 0.5% slower
# than any row after it.
for i, t in enumerate(times):
    later = times[i + 1:]
    if later and t > min(later) * 1.005 + 1e-9:
        problems.append(f"rows are not sorted by job_time_s (row {i}: {t} > later {min(later)})")
        break
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
) || fail "sweep --format json: $out"

# The table and the CSV agree on the first row's GPU and strategy.
first_csv=$(python3 -c 'import csv,sys; r = list(csv.reader(open(sys.argv[1])))[1]; print(r[0], r[2])' "$TMP/csv")
first_table=$(sed -n 2p "$TMP/table" | awk '{print $1, $3}')
[ "$first_csv" = "$first_table" ] || fail "table's first row '$first_table' vs CSV's '$first_csv'"

# --cheapest and --fastest: exactly one row, and it is the cheapest / fastest of the full sweep.
sweep cheapest --format csv --cheapest
[ "$(wc -l <"$TMP/cheapest")" -eq 2 ] || fail "--cheapest printed $(($(wc -l <"$TMP/cheapest") - 1)) rows, expected 1"
sweep by_cost --format csv --objective cost
[ "$(sed -n 2p "$TMP/cheapest")" = "$(sed -n 2p "$TMP/by_cost")" ] ||
  fail "--cheapest row '$(sed -n 2p "$TMP/cheapest")' is not the first row of --objective cost '$(sed -n 2p "$TMP/by_cost")'"
# No row of the time-sorted sweep is cheaper than it.
# (fields read with Python's csv: a composition's name is quoted and holds commas)
cheapest_cost=$(python3 -c 'import csv,sys; print(list(csv.reader(open(sys.argv[1])))[1][11])' "$TMP/cheapest")
python3 -c 'import csv,sys; sys.exit(any(float(r[11]) < float(sys.argv[2]) for r in list(csv.reader(open(sys.argv[1])))[1:]))' \
  "$TMP/csv" "$cheapest_cost" || fail "a row of the sweep is cheaper than --cheapest's $cheapest_cost"
sweep fastest --format csv --fastest
[ "$(wc -l <"$TMP/fastest")" -eq 2 ] || fail "--fastest printed $(($(wc -l <"$TMP/fastest") - 1)) rows, expected 1"
[ "$(sed -n 2p "$TMP/fastest")" = "$(sed -n 2p "$TMP/csv")" ] || fail "--fastest is not the first row of the time-sorted sweep"

# Limits: nothing within 1e-6 hours -> exit 1 with --cheapest; bad format -> exit 2.
"$FTPLAN" "${SWEEP[@]}" --cheapest --max-hours 0.000001 >"$TMP/none" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "--cheapest with an impossible --max-hours exited $rc, expected 1"
"$FTPLAN" "${SWEEP[@]}" --format yaml >"$TMP/yaml" 2>"$TMP/yaml.err"
rc=$?
[ "$rc" -eq 2 ] || fail "--format yaml exited $rc, expected 2"
grep -qF -- "--format" "$TMP/yaml.err" || fail "--format yaml: stderr does not name --format"
"$FTPLAN" "${SWEEP[@]}" --cheapest --fastest >"$TMP/both" 2>"$TMP/both.err"
rc=$?
[ "$rc" -eq 2 ] || fail "--cheapest --fastest exited $rc, expected 2"

if [ "$failures" -ne 0 ]; then
  echo "sweep_formats.sh: $failures check(s) failed"
  exit 1
fi
echo "sweep_formats.sh: all checks passed"
