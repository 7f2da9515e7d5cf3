#!/usr/bin/env bash
# ftplan plan --json and -o plan.json (issue 3, item 5): the keys the CI, ftexec and outside
# tools rely on. Usage: bash plan_json.sh <path-to-ftplan>
SCRIPT=plan_json.sh
source "$(dirname "$0")/lib/harness.sh"

JOB="$FTPLAN_DATA_DIR/configs/jobs/tinyllama-lora-4x-rtx6000ada.json"

"$FTPLAN" plan "$JOB" --json >"$TMP/plan.json" 2>"$TMP/plan.err"
rc=$?
[ "$rc" -eq 0 ] || fail "plan --json exited $rc: $(cat "$TMP/plan.err")"
out=$(python3 - "$TMP/plan.json" <<'PY'
import json, math, sys
problems = []
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"not valid JSON: {e}")
    sys.exit(1)
strategies = d.get("strategies")
if not isinstance(strategies, list) or not strategies:
    problems.append("strategies is not a non-empty array")
    strategies = []
for s in strategies:
    name = s.get("name")
    for key in ("step_time_s", "tokens_per_s", "comm_bytes_per_step", "job_time_s", "cost_usd"):
        v = s.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            problems.append(f"{name}: {key} = {v!r}")
    for key in ("weights", "gradients", "optimizer", "activations", "overhead", "total"):
        if not isinstance(s.get("memory_per_gpu_bytes", {}).get(key), int):
            problems.append(f"{name}: memory_per_gpu_bytes.{key} missing")
    if not isinstance(s.get("fits"), bool):
        problems.append(f"{name}: fits missing")
cands = d.get("candidates")
if not isinstance(cands, list) or not cands:
    problems.append("candidates is not a non-empty array")
    cands = []
for c in cands:
    if c.get("fits") is not True:
        problems.append(f"candidate {c.get('name')} mb {c.get('micro_batch')} does not fit")
rec = d.get("recommended")
if not isinstance(rec, dict):
    problems.append("recommended is not an object")
else:
    if rec.get("strategy") != "ddp":  # TinyLlama fits one GPU: the seeds' rule and ftplan agree on DDP
        problems.append(f"recommended.strategy = {rec.get('strategy')!r}, expected 'ddp'")
    if not isinstance(rec.get("reason"), str) or not rec.get("reason"):
        problems.append("recommended.reason is empty")
    if cands and cands[0].get("name") != rec.get("strategy"):
        problems.append("the first candidate is not the recommended strategy")
# The job: 1024 rows x 1024 tokens; DDP on 4 GPUs x grad-accum 2 x micro-batch 16 x 1024 tokens
# = 131,072 tokens per step: exactly 8 steps, so job_time_s = 8 x step_time_s.
ddp = [s for s in strategies if s.get("name") == "ddp"]
if ddp and ddp[0].get("micro_batch") == 16:
    if abs(ddp[0]["job_time_s"] - 8 * ddp[0]["step_time_s"]) > 1e-9 * ddp[0]["job_time_s"]:
        problems.append(f"ddp job_time_s {ddp[0]['job_time_s']} != 8 x step_time_s {ddp[0]['step_time_s']}")
    if abs(ddp[0]["tokens_per_s"] * ddp[0]["step_time_s"] - 131072) > 1e-6 * 131072:
        problems.append("ddp tokens_per_s x step_time_s != 131,072 tokens per step")
else:
    problems.append("no ddp entry at the job's micro-batch 16")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
) || fail "plan --json: $out"

# -o writes the plan file that ftexec runs.
(cd "$TMP" && "$FTPLAN" plan "$JOB" -o plan-file.json >"$TMP/table.txt" 2>"$TMP/o.err")
rc=$?
[ "$rc" -eq 0 ] || fail "plan -o exited $rc: $(cat "$TMP/o.err")"
[ -s "$TMP/plan-file.json" ] || fail "plan -o plan-file.json wrote no file"
grep -q "recommended:" "$TMP/table.txt" || fail "plan -o did not also print the table"
ls "$TMP"/.plan-file.json* "$TMP"/plan-file.json.tmp* >/dev/null 2>&1 && fail "plan -o left a temporary file behind"
if [ -s "$TMP/plan-file.json" ]; then
  out=$(python3 - "$TMP/plan-file.json" <<'PY'
import json, sys
problems = []
d = json.load(open(sys.argv[1]))
if d.get("format") != "ftplan-plan/1":
    problems.append(f"format = {d.get('format')!r}")
for key in ("job", "candidate", "predicted"):
    if not isinstance(d.get(key), dict):
        problems.append(f"{key} is not an object")
job, cand, pred = d.get("job", {}), d.get("candidate", {}), d.get("predicted", {})
if job.get("strategy") != cand.get("strategy"):
    problems.append("the job's strategy is not the candidate's")
if job.get("micro_batch") != cand.get("micro_batch"):
    problems.append("the job's micro_batch is not the candidate's")
for key in ("checkpointing", "attention"):
    if key not in job:
        problems.append(f"job.{key} is not filled in")
for key in ("step_time_s", "tokens_per_s", "job_time_s"):
    if not isinstance(pred.get(key), (int, float)) or pred.get(key) <= 0:
        problems.append(f"predicted.{key} = {pred.get(key)!r}")
if job.get("model") != "tinyllama-1.1b":
    problems.append(f"job.model = {job.get('model')!r}")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
) || fail "plan file: $out"
  # The plan file is itself a job file: `ftplan memory` accepts it after stripping the envelope.
  python3 -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))["job"], open(sys.argv[2], "w"))' \
    "$TMP/plan-file.json" "$TMP/job-from-plan.json"
  "$FTPLAN" memory "$TMP/job-from-plan.json" --json >/dev/null 2>"$TMP/j.err" ||
    fail "the plan file's job is not a valid job file: $(cat "$TMP/j.err")"
fi

# Nothing fits: no file is written and the exit code says so.
(cd "$TMP" && "$FTPLAN" plan --model llama-3.1-70b --gpu rtx-3090 --seq-len 16384 -o none.json >/dev/null 2>"$TMP/none.err")
rc=$?
[ "$rc" -ne 0 ] || fail "plan -o with nothing that fits exited 0"
[ -e "$TMP/none.json" ] && fail "plan -o with nothing that fits wrote a file"

if [ "$failures" -ne 0 ]; then
  echo "plan_json.sh: $failures check(s) failed"
  exit 1
fi
echo "plan_json.sh: all checks passed"
