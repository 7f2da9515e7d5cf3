#!/usr/bin/env bash
# --from and ftplan export (issue 15, items 1 and 2), end to end on configs as their projects publish
# them (tests/data/configs/README.md): the README's "Use it in CI" command, its JSON, a failing limit,
# and every export target read back with --from.
# Usage: bash import_export.sh <path-to-ftplan>
SCRIPT=import_export.sh
source "$(dirname "$0")/lib/harness.sh"

CONFIGS="$FTPLAN_DATA_DIR/tests/data/configs"

# run EXPECTED_RC DESCRIPTION ARGS...: output in $TMP/out, stderr in $TMP/err.
run() {
  local expected=$1 what=$2
  shift 2
  "$FTPLAN" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -ne "$expected" ]; then
    fail "$what: exit code $rc, expected $expected (ftplan $*)"
    echo "  stdout: $(head -c 2000 "$TMP/out")"
    echo "  stderr: $(cat "$TMP/err")"
    return 1
  fi
  return 0
}
expect_out() {  # what, fixed string expected in stdout
  grep -qF -- "$2" "$TMP/out" || fail "$1: stdout does not contain '$2': $(head -c 3000 "$TMP/out")"
}

# The README's CI command, on axolotl's published TinyLlama config and its ZeRO-3 DeepSpeed config,
# under the names the README gives them.
cd "$TMP" || exit 1
cp "$CONFIGS/axolotl/examples/archived/tiny-llama/pretrain.yml" axolotl.yml
cp "$CONFIGS/axolotl/deepspeed_configs/zero3_bf16.json" ds_zero3.json
if run 0 "README CI command" check --from axolotl.yml --from ds_zero3.json --gpu a100-40gb-sxm --gpus 4 --max-hours 2; then
  expect_out "README CI command" "plan (fixed strategy): zero3 on 4x a100-40gb-sxm, micro-batch 2, checkpointing full"
  expect_out "README CI command" "check passed"
  expect_out "README CI command" "imported: axolotl.yml (axolotl), ds_zero3.json (deepspeed)"
  expect_out "README CI command" "from axolotl.yml: method full (adapter (absent: full fine-tuning))"
  expect_out "README CI command" "model tinyllama-1.1b (base_model)"
  expect_out "README CI command" "from ds_zero3.json: framework deepspeed (zero_optimization)"
  expect_out "README CI command" "note: ds_zero3.json: zero_optimization.stage: ZeRO stage 3 on 4 GPU(s) = zero3"
  expect_out "README CI command" "note: ds_zero3.json: train_micro_batch_size_per_gpu auto: 2 (axolotl.yml: micro_batch_size)"
  expect_out "README CI command" "note: axolotl.yml: max_steps 200: 13107200 tokens"
  expect_out "README CI command" "ignored (22 keys, not job settings): axolotl.yml: logging_steps"
  cp "$TMP/out" "$TMP/ci.txt"
fi

# The same as JSON: the verdict and an "import" object with the files and the ignored keys.
if run 0 "README CI command --json" check --from axolotl.yml --from ds_zero3.json --gpu a100-40gb-sxm --gpus 4 --max-hours 2 --json; then
  python3 - "$TMP/out" <<'EOF' || fail "check --json: import object"
import json, sys
d = json.load(open(sys.argv[1]))
imp = d["import"]
assert d["passed"] is True and d["exit_code"] == 0, d["summary"]
assert [(f["path"], f["kind"]) for f in imp["files"]] == [("axolotl.yml", "axolotl"), ("ds_zero3.json", "deepspeed")], imp["files"]
assert imp["framework"] == "deepspeed" and imp["layout"]["describe"] == "ZeRO stage 3", imp["layout"]
assert "axolotl.yml: pretraining_dataset" in imp["ignored_keys"], imp["ignored_keys"]
assert len(imp["ignored_keys"]) == 22, len(imp["ignored_keys"])
mapped = {m["key"]: (m["value"], m["from"]) for m in imp["mapped"]}
assert mapped["micro_batch"] == (2, "axolotl.yml: micro_batch_size"), mapped["micro_batch"]
assert mapped["seq_len"] == (2048, "axolotl.yml: sequence_len"), mapped["seq_len"]
assert d["plan"]["name"] == "zero3", d["plan"]
EOF
fi

# A limit the plan cannot meet: exit 1, naming the limit.
if run 1 "CI command, 0.01 h" check --from axolotl.yml --from ds_zero3.json --gpu a100-40gb-sxm --gpus 4 --max-hours 0.01; then
  expect_out "CI command, 0.01 h" "FAIL time"
fi

# A flag equal to the file's value is fine; one that contradicts it is exit 2, naming both.
run 0 "an equal flag" check --from axolotl.yml --from ds_zero3.json --gpu a100-40gb-sxm --gpus 4 --max-hours 2 --micro-batch 2
if run 2 "a contradicting flag" check --from axolotl.yml --from ds_zero3.json --gpu a100-40gb-sxm --gpus 4 --micro-batch 4; then
  grep -qF -- "--micro-batch 4 contradicts axolotl.yml: micro_batch_size 2" "$TMP/err" || fail "contradicting flag: $(cat "$TMP/err")"
fi

# Every command takes --from.
for cmd in memory plan sweep simulate; do
  extra=()
  [ "$cmd" = sweep ] && extra=(--gpu-types a100-40gb-sxm --gpu-counts 4)
  run 0 "$cmd --from" "$cmd" --from axolotl.yml --from ds_zero3.json --gpu a100-40gb-sxm --gpus 4 "${extra[@]}" &&
    { [ "$cmd" = sweep ] || expect_out "$cmd --from" "imported: axolotl.yml (axolotl), ds_zero3.json (deepspeed)"; }
done
run 0 "sweep --format csv --from" sweep --from axolotl.yml --from ds_zero3.json --gpu a100-40gb-sxm --gpu-types a100-40gb-sxm --gpu-counts 4 --format csv &&
  { grep -qF "imported: axolotl.yml" "$TMP/err" || fail "sweep csv: the import report belongs on stderr: $(cat "$TMP/err")"; }

# Export: a plan in every target's keys, read back with --from to the same layout and batch.
run 0 "plan -o" plan --model llama-3.1-8b --method lora --lora-rank 32 --gpu a100-80gb-sxm --gpus 8 --framework deepspeed \
  --strategy zero3 --micro-batch 4 --grad-accum 2 --checkpointing full --dataset-rows 20000 --mean-tokens-per-row 512 -o "$TMP/plan.json"
for target in deepspeed accelerate axolotl llamafactory torchrun slurm; do
  case $target in deepspeed) ext=json ;; torchrun) ext=sh ;; slurm) ext=sbatch ;; *) ext=yaml ;; esac
  run 0 "export --to $target" export "$TMP/plan.json" --to "$target" -o "$TMP/exported.$ext" || continue
  flags=(--gpu a100-80gb-sxm)
  case $target in
    axolotl | llamafactory) flags+=(--gpus 8) ;;  # the GPUs are the launcher's (torchrun, accelerate, sbatch)
    deepspeed) flags+=(--model llama-3.1-8b --method lora --lora-rank 32 --gpus 8 --checkpointing full) ;;
    accelerate) flags+=(--model llama-3.1-8b --method lora --lora-rank 32 --micro-batch 4 --checkpointing full) ;;
    torchrun | slurm) flags+=(--model llama-3.1-8b --method lora --lora-rank 32 --framework deepspeed --strategy zero3 \
      --micro-batch 4 --grad-accum 2 --checkpointing full) ;;
  esac
  if run 0 "--from the $target export" plan --from "$TMP/exported.$ext" "${flags[@]}" --json; then
    python3 - "$TMP/out" "$target" <<'EOF' || fail "--from the $target export: not the planned job"
import json, sys
d, target = json.load(open(sys.argv[1])), sys.argv[2]
job = d["job"]
assert job["strategy"] == "zero3" and job["gpus"] == 8, job
assert job["micro_batch"] == 4 and job["grad_accum"] == 2 and job["checkpointing"] == "full", job
assert job["framework"] == "deepspeed" and job["precision"] == "mixed", job
assert job["lora"]["rank"] == 32, job
EOF
  fi
done
run 0 "export to stdout" export "$TMP/plan.json" --to deepspeed && expect_out "export to stdout" '"train_batch_size": 64'
if run 0 "slurm time limit" export "$TMP/plan.json" --to slurm; then
  expect_out "slurm time limit" "#SBATCH --nodes=1"
  expect_out "slurm time limit" "#SBATCH --gpus-per-node=8"
  expect_out "slurm time limit" "srun torchrun --nnodes=1 --nproc_per_node=8"
fi

# A target that cannot express the plan: exit 2, one line naming the target and the key.
if run 2 "export a ZeRO plan to torchtune" export "$TMP/plan.json" --to torchtune; then
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "export refusal: not one line: $(cat "$TMP/err")"
  grep -qF -- "--to torchtune: strategy zero3" "$TMP/err" || fail "export refusal: $(cat "$TMP/err")"
fi

if [ "$failures" -ne 0 ]; then
  echo "import_export.sh: $failures check(s) failed"
  exit 1
fi
echo "import_export.sh: all checks passed"
