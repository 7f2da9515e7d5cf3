#!/usr/bin/env bash
# Outputs and gates (hardening issue, items 2, 5, 6): how -o, --trace and --out write (a symlink's
# target, special files, standard output, permissions kept, nothing left behind); check --json,
# --strategy and --any; compare refusing a run of another job; a plan written with a relative
# model path runs from another folder; job files accepted by ftexec.
# Usage: bash outputs_and_gates.sh <path-to-ftplan>   (FTEXEC=<path-to-ftexec> for the ftexec cases)
SCRIPT=outputs_and_gates.sh
source "$(dirname "$0")/lib/harness.sh"
TINY=(--model tiny-test --gpu cpu --seq-len 32 --micro-batch 2 --attention eager --precision fp32 --checkpointing none)

# -o through a symbolic link: the target is written, the link stays a link.
echo stale >"$TMP/target.json"
ln -s target.json "$TMP/link.json"
"$FTPLAN" plan "${TINY[@]}" -o "$TMP/link.json" >/dev/null || fail "plan -o link: exit $?"
[ -L "$TMP/link.json" ] || fail "-o replaced the symbolic link with a regular file"
grep -q '"ftplan-plan/1"' "$TMP/target.json" || fail "-o did not write the link's target"
# A dangling link: its target is created.
ln -s new-target.json "$TMP/dangling.json"
"$FTPLAN" plan "${TINY[@]}" -o "$TMP/dangling.json" >/dev/null && [ -L "$TMP/dangling.json" ] &&
  [ -f "$TMP/new-target.json" ] || fail "-o through a dangling link did not create its target"

# An existing file keeps its permission bits; no temporary file is left behind.
echo old >"$TMP/plan.json"
chmod 640 "$TMP/plan.json"
"$FTPLAN" plan "${TINY[@]}" -o "$TMP/plan.json" >/dev/null
[ "$(stat -c %a "$TMP/plan.json")" = 640 ] || fail "-o changed the file's mode to $(stat -c %a "$TMP/plan.json")"
ls -a "$TMP" | grep -q '\.tmp\.' && fail "a temporary file was left behind: $(ls -a "$TMP")"

# Standard output: '-', /dev/stdout (a link to a pipe) and a FIFO are written in place.
"$FTPLAN" plan "${TINY[@]}" -o - | grep -q '"ftplan-plan/1"' || fail "-o - did not print the plan"
"$FTPLAN" plan "${TINY[@]}" -o /dev/stdout | grep -q '"ftplan-plan/1"' || fail "-o /dev/stdout did not print the plan"
mkfifo "$TMP/fifo"
cat "$TMP/fifo" >"$TMP/from-fifo" &
reader=$!
timeout 10 "$FTPLAN" plan "${TINY[@]}" -o "$TMP/fifo" >/dev/null || fail "plan -o FIFO: exit $?"
wait $reader
[ -p "$TMP/fifo" ] || fail "-o replaced the FIFO with a regular file"
grep -q '"ftplan-plan/1"' "$TMP/from-fifo" || fail "nothing came through the FIFO"
# A device node stays one (as root the old writer replaced /dev/full with a regular file).
if [ "$(id -u)" = 0 ] && mknod "$TMP/full" c 1 7 2>/dev/null; then
  "$FTPLAN" plan "${TINY[@]}" -o "$TMP/full" >/dev/null 2>"$TMP/err"
  rc=$?
  [ $rc -eq 2 ] || fail "-o on a full device: exit $rc, expected 2"
  [ -c "$TMP/full" ] || fail "-o replaced a device node with a regular file"
fi
# A folder, or a folder that does not exist: exit 2 before any work, naming -o.
"$FTPLAN" plan "${TINY[@]}" -o "$TMP" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q -- "-o" "$TMP/err" || fail "-o a folder: exit $rc: $(cat "$TMP/err")"
"$FTPLAN" plan "${TINY[@]}" -o "$TMP/no/such/plan.json" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] || fail "-o into a missing folder: exit $rc"
# --trace through a link, like -o.
ln -s trace-target.json "$TMP/trace.json"
"$FTPLAN" simulate "${TINY[@]}" --strategy single --trace "$TMP/trace.json" >/dev/null || fail "simulate --trace: exit $?"
[ -L "$TMP/trace.json" ] && grep -q traceEvents "$TMP/trace-target.json" || fail "--trace did not write the link's target"

# check --json is JSON with the verdict; exit codes 0 / 1 as the text report.
"$FTPLAN" check "${TINY[@]}" --max-memory-fraction 0.9 --json >"$TMP/check.json"; rc=$?
[ $rc -eq 0 ] || fail "check --json within limits: exit $rc"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["passed"] is True and j["exit_code"] == 0 and j["limits"][0]["limit"] == "memory", j' \
  "$TMP/check.json" || fail "check --json: not the expected JSON: $(head -c 300 "$TMP/check.json")"
"$FTPLAN" check "${TINY[@]}" --max-memory-fraction 0.00001 --json >"$TMP/check.json"; rc=$?
[ $rc -eq 1 ] || fail "check --json over a limit: exit $rc, expected 1"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["passed"] is False and j["limits"][0]["ok"] is False' \
  "$TMP/check.json" || fail "check --json over a limit: not the expected JSON"

# --any: the cheapest plan (objective cost) is too slow for the limit, a faster one meets it.
JOB=(configs/jobs/llama-3-8b-instruct-lora-a100-40gb.json)
"$FTPLAN" plan "$FTPLAN_DATA_DIR/${JOB[0]}" --json >"$TMP/plan.json"
hours=$(python3 -c '
import json,sys
c = json.load(open(sys.argv[1]))["candidates"]
t = sorted(x["job_time_s"] for x in c)
print((t[0] + t[-1]) / 2 / 3600)' "$TMP/plan.json")
"$FTPLAN" check "$FTPLAN_DATA_DIR/${JOB[0]}" --objective cost --max-hours "$hours" >"$TMP/out"; rc_rec=$?
"$FTPLAN" check "$FTPLAN_DATA_DIR/${JOB[0]}" --objective cost --max-hours "$hours" --any >"$TMP/out-any"; rc_any=$?
[ $rc_any -eq 0 ] || fail "check --any: exit $rc_any with a limit some plan meets: $(cat "$TMP/out-any")"
grep -q "best meeting the limits" "$TMP/out-any" || fail "check --any does not say which plan it judged"
[ $rc_rec -eq 1 ] || echo "note: the recommended (cheapest) plan also met $hours h (rc $rc_rec)"
# --strategy judges that strategy's best plan.
"$FTPLAN" check "$FTPLAN_DATA_DIR/${JOB[0]}" --strategy zero3 --max-memory-fraction 1 --json >"$TMP/check.json"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["mode"] == "strategy" and j["plan"]["name"] == "zero3", j["plan"]' \
  "$TMP/check.json" || fail "check --strategy zero3 did not judge zero3"

if [ -n "${FTEXEC:-}" ]; then
  # A plan written with a relative model path runs from another folder.
  mkdir -p "$TMP/work/models" "$TMP/elsewhere"
  cp "$FTPLAN_DATA_DIR/configs/models/tiny-test.json" "$TMP/work/models/t.json"
  (cd "$TMP/work" && "$FTPLAN" plan --model models/t.json --gpu cpu --seq-len 32 --micro-batch 2 --attention eager \
      --precision fp32 --checkpointing none -o plan.json >/dev/null) || fail "plan with a relative model path: exit $?"
  (cd "$TMP/elsewhere" && "$FTEXEC" run ../work/plan.json --steps 2 --threads 1 --no-progress --out m.json >/dev/null 2>"$TMP/err") ||
    fail "ftexec could not run a plan written with a relative model path from another folder: $(cat "$TMP/err")"
  # compare refuses a run of another job, naming the fields, unless --force.
  "$FTEXEC" run --model tiny-test --method lora --device cpu --seq-len 32 --micro-batch 2 --steps 2 --threads 1 \
    --no-progress --out "$TMP/lora.json" >/dev/null 2>&1 || fail "ftexec lora run failed"
  "$FTPLAN" compare "$TMP/work/plan.json" "$TMP/lora.json" >/dev/null 2>"$TMP/err"; rc=$?
  [ $rc -eq 2 ] && grep -q "method: plan full, measured lora" "$TMP/err" && [ "$(wc -l <"$TMP/err")" -eq 1 ] ||
    fail "compare of another job: exit $rc: $(cat "$TMP/err")"
  "$FTPLAN" compare "$TMP/work/plan.json" "$TMP/lora.json" --force >"$TMP/out" || fail "compare --force: exit $?"
  grep -q "although the run differs" "$TMP/out" || fail "compare --force does not say the runs differ"
  "$FTPLAN" compare "$TMP/work/plan.json" "$TMP/elsewhere/m.json" >/dev/null || fail "compare of the same job: exit $?"
  # ftexec runs a job file, and --out - prints measured.json alone on standard output.
  "$FTEXEC" run "$FTPLAN_DATA_DIR/configs/jobs/tinyllama-lora-4x-rtx6000ada.json" --model tiny-test --device cpu --steps 1 \
    --seq-len 16 --micro-batch 1 --threads 1 --no-progress --out - 2>/dev/null >"$TMP/m.json" || fail "ftexec run JOB.json: exit $?"
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["job"]["method"] == "lora"' "$TMP/m.json" ||
    fail "ftexec --out - did not print measured.json of the job file's LoRA job"
fi
if [ "$failures" -ne 0 ]; then
  echo "outputs_and_gates.sh: $failures check(s) failed"
  exit 1
fi
echo "outputs_and_gates.sh: all checks passed"
