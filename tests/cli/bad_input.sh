#!/usr/bin/env bash
# Bad input (issue 2, item 6): each case exits with code exactly 2, prints exactly one line on
# stderr that names the offending field, and never crashes (no "terminate", no "Aborted").
# Usage: bash bad_input.sh <path-to-ftplan>
SCRIPT=bad_input.sh
source "$(dirname "$0")/lib/harness.sh"

# expect_bad NAME FIELD ARGS...: ftplan ARGS must exit 2 with one stderr line containing FIELD.
expect_bad() {
  local name=$1 field=$2
  shift 2
  "$FTPLAN" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$TMP/err")
  [ "$rc" -eq 2 ] || fail "$name: exit code $rc, expected 2 (ftplan $*); stderr: $(cat "$TMP/err")"
  [ "$lines" -eq 1 ] || fail "$name: $lines line(s) on stderr, expected exactly 1: $(cat "$TMP/err")"
  grep -qF -- "$field" "$TMP/err" || fail "$name: stderr does not name '$field': $(cat "$TMP/err")"
  if grep -qiE "terminate|aborted|core dumped|internal error" "$TMP/err"; then
    fail "$name: crashed: $(cat "$TMP/err")"
  fi
}

MODEL_JSON="$FTPLAN_DATA_DIR/configs/models/llama-3-8b.json"
JOB_JSON="$FTPLAN_DATA_DIR/configs/jobs/tinyllama-lora-4x-rtx6000ada.json"

# Malformed JSON: a job file and a model config cut short.
printf '{"model": "llama-3-8b",\n' >"$TMP/truncated-job.json"
expect_bad "malformed job file" "truncated-job.json" memory "$TMP/truncated-job.json"
head -c 200 "$MODEL_JSON" >"$TMP/truncated-model.json"
expect_bad "malformed model config" "truncated-model.json" memory --model "$TMP/truncated-model.json"

# Unknown names.
expect_bad "unknown GPU" "--gpu" memory --model llama-3-8b --gpu a100-81gb
expect_bad "unknown model" "--model" memory --model llama-9-8b
expect_bad "unknown method" "--method" memory --model llama-3-8b --method dora
expect_bad "unknown strategy" "--strategy" plan --model llama-3-8b --strategy deepspeed

# Zero, negative and non-numeric sizes.
expect_bad "micro-batch -1" "--micro-batch" memory --model llama-3-8b --micro-batch -1
expect_bad "micro-batch 0" "--micro-batch" memory --model llama-3-8b --micro-batch 0
expect_bad "seq-len abc" "--seq-len" memory --model llama-3-8b --seq-len abc
expect_bad "gpus 0" "--gpus" memory --model llama-3-8b --gpus 0
expect_bad "lora-rank -8" "--lora-rank" memory --model llama-3-8b --method lora --lora-rank -8

# An unknown key in a job file (a typo of micro_batch).
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["micro_bacth"] = 4; json.dump(d, open(sys.argv[2], "w"))' \
  "$JOB_JSON" "$TMP/typo-job.json"
expect_bad "unknown key in a job file" "micro_bacth" memory "$TMP/typo-job.json"
# A negative micro_batch in a job file.
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["micro_batch"] = -4; json.dump(d, open(sys.argv[2], "w"))' \
  "$JOB_JSON" "$TMP/negative-job.json"
expect_bad "negative micro_batch in a job file" "micro_batch" memory "$TMP/negative-job.json"

# Heads that do not divide the hidden size (no head_dim given): 32 heads, hidden 4100.
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["hidden_size"] = 4100; d.pop("head_dim", None); json.dump(d, open(sys.argv[2], "w"))' \
  "$MODEL_JSON" "$TMP/heads.json"
expect_bad "heads not dividing hidden" "hidden_size" memory --model "$TMP/heads.json"
# GQA: key/value heads that do not divide the attention heads.
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["num_key_value_heads"] = 7; json.dump(d, open(sys.argv[2], "w"))' \
  "$MODEL_JSON" "$TMP/kv-heads.json"
expect_bad "kv heads not dividing heads" "num_key_value_heads" memory --model "$TMP/kv-heads.json"

# Absurd sizes that would overflow.
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["hidden_size"] = 10**12; json.dump(d, open(sys.argv[2], "w"))' \
  "$MODEL_JSON" "$TMP/absurd-model.json"
expect_bad "absurd hidden_size" "hidden_size" memory --model "$TMP/absurd-model.json"

# Architectures not modelled are refused by the key that says so, never approximated.
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["model_type"] = "gpt_neox"; json.dump(d, open(sys.argv[2], "w"))' \
  "$MODEL_JSON" "$TMP/neox.json"
expect_bad "unknown model_type" "model_type" memory --model "$TMP/neox.json"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["use_parallel_residual"] = True; json.dump(d, open(sys.argv[2], "w"))' \
  "$MODEL_JSON" "$TMP/parallel.json"
expect_bad "an architecture key not modelled" "use_parallel_residual" memory --model "$TMP/parallel.json"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["quantization_config"] = {"quant_method": "hqq", "nbits": 4}; json.dump(d, open(sys.argv[2], "w"))' \
  "$MODEL_JSON" "$TMP/hqq.json"
expect_bad "a quant_method not modelled" "quantization_config.quant_method" memory --model "$TMP/hqq.json" --method lora
expect_bad "Phi-3 has no q_proj" "qkv_proj" memory --model phi-3-mini-4k --method lora --lora-targets q_proj,v_proj
expect_bad "absurd seq-len" "--seq-len" memory --model llama-3-8b --seq-len 99999999999
expect_bad "absurd gpus" "--gpus" memory --model llama-3-8b --gpus 999999999999
expect_bad "absurd micro-batch" "--micro-batch" memory --model llama-3-8b --micro-batch 99999999999
expect_bad "seq-len beyond int64" "--seq-len" memory --model llama-3-8b --seq-len 99999999999999999999999

# A plan that does not fit is a result, not an error: exit 0, fits=false with a reason.
"$FTPLAN" memory --model llama-3.1-70b --gpu rtx-3090 --json >"$TMP/oom.json" 2>"$TMP/oom.err"
rc=$?
[ "$rc" -eq 0 ] || fail "an out-of-memory job exited $rc, expected 0: $(cat "$TMP/oom.err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
single = [s for s in d["strategies"] if s["name"] == "single"][0]
sys.exit(0 if single["fits"] is False and single["reason"].startswith("out of memory by") else 1)' "$TMP/oom.json" ||
  fail "70B full FT on one RTX 3090: single should be fits=false with 'out of memory by ...'"

# Framework profiles (issue 11): an unknown framework, a knob the framework does not offer or
# refuses, the longest row below the mean.
expect_bad "unknown framework" "--framework" memory --model llama-3-8b --framework megatron-lm
expect_bad "optimizer in backward with accumulation" "--optimizer-in-backward" \
  plan --model llama-3.2-1b --framework torchtune --optimizer-in-backward --grad-accum 4
expect_bad "activation offload under hf" "--activation-offload" memory --model llama-3.2-1b --activation-offload
expect_bad "chunked loss under hf" "--loss chunked" memory --model llama-3.2-1b --loss chunked
expect_bad "max tokens below the mean" "--max-tokens-per-row" \
  memory --model llama-3.2-1b --dataset-rows 100 --mean-tokens-per-row 900 --max-tokens-per-row 500
expect_bad "an FSDP version the framework does not run" "--fsdp-version" memory --model llama-3.2-1b --framework ftexec --fsdp-version 2
expect_bad "check: bad host-memory fraction" "--max-host-memory-fraction" check --model llama-3.2-1b --max-host-memory-fraction 1.5

# Parallelism as degrees (--parallel): every operand named, in one line.
P=(plan --model llama-3-8b --gpu h100-sxm --method full --framework torchtitan)
expect_bad "degrees that do not multiply to the GPU count" "tp(8) * pp(2) * dp_shard(4) = 64 != gpus(32)" "${P[@]}" --gpus 32 --parallel tp=8,pp=2,dp_shard=4
expect_bad "tp not dividing the heads" "tp(3) does not divide num_attention_heads(32)" "${P[@]}" --gpus 3 --parallel tp=3
expect_bad "pp above the layer count" "pp(64) > num_hidden_layers(32)" "${P[@]}" --gpus 64 --parallel pp=64
expect_bad "a sequence cp cannot split" "cp(3) cannot split seq_len(4096)" "${P[@]}" --gpus 3 --seq-len 4096 --parallel cp=3
expect_bad "an unknown key in --parallel" "--parallel: foo: unknown key" "${P[@]}" --gpus 8 --parallel tp=8,foo=1
expect_bad "a degree given twice" "--parallel: tp: given twice" "${P[@]}" --gpus 8 --parallel tp=2,tp=4
expect_bad "a dimension the framework does not offer" "composes no pipeline parallelism" plan --model llama-3-8b --gpu h100-sxm --framework hf --gpus 8 --parallel pp=2,dp_shard=4
expect_bad "accelerate's tp/cp over pure replicas" "sharded data parallelism only" plan --model llama-3-8b --gpu h100-sxm --gpus 8 --seq-len 4096 --parallel cp=2,dp_replicate=4
printf '{"model": "llama-3-8b", "gpu": "h100-sxm", "gpus": 16, "framework": "torchtitan", "parallel": "tp=8,dp_shard=4"}' >"$TMP/parallel-job.json"
expect_bad "a job file's parallel key" "tp(8) * dp_shard(4) = 32 != gpus(16)" plan "$TMP/parallel-job.json"

# Mixtures of experts (issue 14): an expert count that ep does not divide (one line naming both), expert
# parallelism under a framework without it, an MoE key the family does not read, experts on a dense family.
expect_bad "ep not dividing the experts" "ep(3) does not divide num_experts(8)" \
  plan --model mixtral-8x7b --gpu h100-sxm --gpus 24 --framework torchtitan --parallel dp_shard=24,ep=3
expect_bad "ep under a framework without it" "--parallel ep=8" \
  plan --model mixtral-8x7b --gpu h100-sxm --gpus 8 --parallel dp_shard=8,ep=8
expect_bad "ep on a dense model" "has no experts" \
  plan --model llama-3-8b --gpu h100-sxm --gpus 8 --framework torchtitan --parallel dp_shard=8,ep=8
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["n_shared_experts"] = 2; json.dump(d, open(sys.argv[2], "w"))' \
  "$FTPLAN_DATA_DIR/configs/models/mixtral-8x7b.json" "$TMP/mixtral-shared.json"
expect_bad "an MoE key the family does not read" "n_shared_experts" memory --model "$TMP/mixtral-shared.json"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["num_local_experts"] = 8; json.dump(d, open(sys.argv[2], "w"))' \
  "$MODEL_JSON" "$TMP/llama-experts.json"
expect_bad "experts on a dense family" "num_local_experts" memory --model "$TMP/llama-experts.json"
expect_bad "an imbalance beyond num_experts / top_k" "moe.imbalance_factor" \
  memory --model mixtral-8x7b --gpu h100-sxm --moe-imbalance-factor 5

# --from and export (issue 15): an unknown file kind, a value of the wrong type, malformed YAML, two
# files that disagree, a flag that contradicts a file, a model the name table lacks, a setting the
# planner does not model, and an export target that cannot express the plan.
CONFIGS="$FTPLAN_DATA_DIR/tests/data/configs"
printf 'foo: 1\nbar: [2]\n' >"$TMP/mystery.yaml"
expect_bad "--from: unknown file kind" "mystery.yaml: unknown config kind" memory --from "$TMP/mystery.yaml"
printf 'base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: four\n' >"$TMP/wrong-type.yml"
expect_bad "--from: wrong value type" "wrong-type.yml: micro_batch_size" memory --from "$TMP/wrong-type.yml"
printf '{"zero_optimization": {"stage": "three"}}' >"$TMP/wrong-stage.json"
expect_bad "--from: wrong value type (DeepSpeed)" "wrong-stage.json: zero_optimization.stage" memory --model llama-3.2-1b --from "$TMP/wrong-stage.json"
printf 'base_model: [unclosed\n' >"$TMP/broken.yml"
expect_bad "--from: malformed YAML" "broken.yml" memory --from "$TMP/broken.yml"
printf '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}}' >"$TMP/ds-mb4.json"
expect_bad "--from: two files disagree" "qlora.yml: micro_batch_size 2 disagrees with" \
  memory --from "$CONFIGS/axolotl/examples/llama-3/qlora.yml" --from "$TMP/ds-mb4.json" --gpus 4
expect_bad "--from: a flag contradicts a file" "--seq-len 1024 contradicts" \
  memory --from "$CONFIGS/axolotl/examples/llama-3/qlora.yml" --seq-len 1024
expect_bad "--from: a strategy flag contradicts the DeepSpeed stage" "zero_optimization.stage" \
  memory --model llama-3.2-1b --from "$CONFIGS/axolotl/deepspeed_configs/zero3.json" --gpus 4 --strategy zero2
expect_bad "--from: unknown model name" "model_name_or_path" memory --from "$CONFIGS/llamafactory/examples/train_lora/qwen3_lora_sft.yaml"
expect_bad "--from: a setting not modelled" "zero_optimization.offload_param" \
  memory --model llama-3.2-1b --from "$CONFIGS/axolotl/deepspeed_configs/zero3_bf16_cpuoffload_params.json"
expect_bad "--from: a missing file" "--from" memory --from "$TMP/no-such-config.yml"
"$FTPLAN" plan --model llama-3.2-1b --gpu h100-sxm --gpus 4 --strategy zero2 --micro-batch 2 -o "$TMP/plan-z2.json" >/dev/null 2>&1
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["job"].pop("strategy", None); d["job"]["parallel"] = "dp_shard=4,shard=zero2,offload=optimizer+params"; json.dump(d, open(sys.argv[1], "w"))' "$TMP/plan-z2.json"
expect_bad "export: param offload below stage 3" "--to deepspeed: zero_optimization.offload_param" export "$TMP/plan-z2.json" --to deepspeed
expect_bad "export: unknown target" "--to" export "$TMP/plan-z2.json" --to megatron
expect_bad "export: not a plan" "not a plan" export "$CONFIGS/axolotl/deepspeed_configs/zero3.json" --to deepspeed

if [ "$failures" -ne 0 ]; then
  echo "bad_input.sh: $failures check(s) failed"
  exit 1
fi
echo "bad_input.sh: all checks passed"
