#!/usr/bin/env bash
# Run logs (issue "Close the loop", item 1): `ftplan compare PLAN RUN...` reads the logs the stacks
# write (tests/data/logs/, sources in SOURCES.md), holds each figure against the matching
# prediction, shows what a log lacks as missing, refuses an unknown format and a run of another
# job with one line and exit 2.
# Usage: bash run_logs.sh <path-to-ftplan>
SCRIPT=run_logs.sh
source "$(dirname "$0")/lib/harness.sh"
LOGS="$FTPLAN_DATA_DIR/tests/data/logs"
HF_STATE="$LOGS/hf_tinyllama_qlora_trainer_state.json"
# The HF run (anonymousgigachad/llm-training train.py): TinyLlama-1.1B QLoRA r=8 alpha 16 on q,v,
# batch 2 x 4 accumulation, rows padded to 512 tokens, one GPU (an L4 assumed: the file names none).
HF_JOB=(--model tinyllama-1.1b --method qlora --lora-rank 8 --lora-alpha 16 --lora-targets q_proj,v_proj
        --gpu l4 --seq-len 512 --grad-accum 4 --strategy single)

"$FTPLAN" plan "${HF_JOB[@]}" --micro-batch 2 -o "$TMP/hf-plan.json" >/dev/null || fail "plan -o (HF job): exit $?"
"$FTPLAN" compare "$TMP/hf-plan.json" "$HF_STATE" >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 0 ] || fail "compare with trainer_state.json: exit $rc: $(cat "$TMP/err")"
grep -q "hf-trainer-state" "$TMP/out" || fail "compare does not name the format read: $(cat "$TMP/out")"
grep -E -q "^step_time_s .* 10\.491 s" "$TMP/out" || fail "step time is not train_runtime / global_step: $(cat "$TMP/out")"
grep -E -q "^peak allocated \(max_memory_allocated\) .* missing" "$TMP/out" || fail "allocated not shown as missing"
grep -q "names no model" "$TMP/out" || fail "no note that trainer_state.json names no model"
"$FTPLAN" compare "$TMP/hf-plan.json" "$HF_STATE" --json >"$TMP/c.json" || fail "compare --json: exit $?"
python3 - "$TMP/c.json" <<'PY' || fail "compare --json: not the expected rows: $(head -c 600 "$TMP/c.json")"
import json, sys
c = json.load(open(sys.argv[1]))
rows = {r["figure"]: r for r in c["rows"]}
assert abs(rows["step_time_s"]["measured"] - 472.0904 / 45) < 1e-9, rows["step_time_s"]
assert abs(rows["tokens_per_s"]["measured"] - 0.763 * 512) < 1e-9, rows["tokens_per_s"]
for f in ("peak allocated (max_memory_allocated)", "peak reserved (max_memory_reserved)", "device memory (nvidia-smi)"):
    assert rows[f]["missing"] is True and rows[f]["measured"] is None, rows[f]
assert c["run"]["format"] == "hf-trainer-state" and len(c["run"]["loss"]) == 4, c["run"]
PY

# A plan of another shape (micro-batch 4; the trainer_state says 2): one line naming the field, exit 2.
"$FTPLAN" plan "${HF_JOB[@]}" --micro-batch 4 -o "$TMP/hf-plan-mb4.json" >/dev/null || fail "plan -o (micro-batch 4): exit $?"
"$FTPLAN" compare "$TMP/hf-plan-mb4.json" "$HF_STATE" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "micro_batch: plan 4, measured 2" "$TMP/err" ||
  fail "compare with a plan of another micro-batch: exit $rc: $(cat "$TMP/err")"
"$FTPLAN" compare "$TMP/hf-plan-mb4.json" "$HF_STATE" --force | grep -q "although the run differs" ||
  fail "compare --force does not say the run differs"

# torchtune's log (CodeLlama-7B full, code_llama2/7B_full_low_memory): a job file as PLAN, planned
# here (-o refuses what ftexec cannot run: the paged optimizer, the optimizer in backward).
cat >"$TMP/tt-job.json" <<JSON
{"model": "$LOGS/codellama-7b-hf.config.json", "framework": "torchtune", "gpu": "a100-80gb-sxm", "gpus": 1,
 "method": "full", "precision": "bf16", "paged_optimizer": true, "optimizer_in_backward": true,
 "seq_len": 512, "micro_batch": 2, "checkpointing": "full", "strategy": "single"}
JSON
"$FTPLAN" compare "$TMP/tt-job.json" "$LOGS/torchtune_codellama7b_full_low_memory.log" >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 0 ] || fail "compare with the torchtune log: exit $rc: $(cat "$TMP/err")"
grep -E -q "^tokens_per_s .* 417\.5 tokens/s" "$TMP/out" || fail "torchtune tokens/s not read: $(cat "$TMP/out")"
grep -E -q "^step_time_s .* missing" "$TMP/out" || fail "torchtune step time not shown as missing"
grep -q "planned here from the job file" "$TMP/out" || fail "compare does not say it planned the job file"

# Several runs: one comparison each (text and JSON).
"$FTPLAN" compare "$TMP/hf-plan.json" "$HF_STATE" "$LOGS/deepspeed_see_memory_usage.log" --json >"$TMP/c.json" ||
  fail "compare of two runs: exit $?"
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); assert [x["run"]["format"] for x in c["comparisons"]] == ["hf-trainer-state", "deepspeed-log"]' \
  "$TMP/c.json" || fail "compare of two runs: not one comparison each"
# Ranks of one job: the most loaded rank.
printf 'step,step_time_s,max_memory_reserved_gib\n1,1.0,10\n2,1.0,10\n' >"$TMP/rank0.csv"
printf 'step,step_time_s,max_memory_reserved_gib\n1,1.0,12\n2,1.2,12\n' >"$TMP/rank1.csv"
"$FTPLAN" compare "$TMP/hf-plan.json" "$TMP/rank0.csv" "$TMP/rank1.csv" --ranks >"$TMP/out" || fail "compare --ranks: exit $?"
grep -q "most loaded rank, $TMP/rank1.csv" "$TMP/out" || fail "--ranks does not name the most loaded rank: $(cat "$TMP/out")"
[ "$(grep -c '^run: ' "$TMP/out")" -eq 1 ] || fail "--ranks printed more than one comparison"

# Bad input: a file of no known format, a run of another model: one line, exit 2.
printf 'hello\nthis is no run log\n' >"$TMP/garbage.txt"
"$FTPLAN" compare "$TMP/hf-plan.json" "$TMP/garbage.txt" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "garbage.txt: unknown run-log format" "$TMP/err" ||
  fail "garbage log: exit $rc: $(cat "$TMP/err")"
head -c 64 /dev/urandom >"$TMP/binary.log"
"$FTPLAN" compare "$TMP/hf-plan.json" "$TMP/binary.log" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "binary log: exit $rc: $(cat "$TMP/err")"
echo '{"job": {"model": "llama-3-8b", "seq_len": 512}, "step_time_s": 1.5}' >"$TMP/other-model.json"
"$FTPLAN" compare "$TMP/hf-plan.json" "$TMP/other-model.json" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "model: plan tinyllama-1.1b" "$TMP/err" ||
  fail "a run of another model: exit $rc: $(cat "$TMP/err")"
"$FTPLAN" compare "$TMP/hf-plan.json" "$LOGS/torchtune_mps_llama31_8b_full.log" --torchtune-memory-unit mb >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "--torchtune-memory-unit mb: exit $rc: $(cat "$TMP/err")"

if [ "$failures" -ne 0 ]; then
  echo "run_logs.sh: $failures check(s) failed"
  exit 1
fi
echo "run_logs.sh: all checks passed"
