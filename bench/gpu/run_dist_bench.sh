#!/usr/bin/env bash
# Distributed ftexec on GPUs (issue 6): every strategy's code path over NCCL, and per-rank peak
# memory of DDP vs ZeRO-3 (and ZeRO-1/2, FSDP) beside the planner's prediction.
#
# Usage, from the repository root on a machine with NVIDIA GPUs, after bench/gpu/run_gpu_bench.sh
# has built build-gpu/ against a PyTorch 2.x wheel's libtorch (CUDA, USE_C10D_NCCL defined by
# executor/CMakeLists.txt when the libtorch has CUDA):
#   bash bench/gpu/run_dist_bench.sh [GPU_ID] [NPROC] [MODEL]
#     GPU_ID  hwdb id for the prediction (default h100-sxm)     NPROC ranks (default: all visible GPUs)
#     MODEL   configs/models name (default llama-3.2-1b)
# One rank per GPU (cuda:LOCAL_RANK). Several ranks on ONE GPU: NCCL refuses two ranks of one
# communicator on the same device ("Duplicate GPU detected"), and Gloo's send/recv (our ring
# reduce-scatter/all-gather) take CPU tensors only, so a single GPU cannot host several ranks of this
# executor; the per-rank memory comparison then needs 2+ GPUs. On CPU the same comparison runs in
# CI: tests/executor/test_distributed.cpp ("per-rank memory orders ...").
# Not run yet: no GPU was available when this was written (issue 6's session); the NCCL path is
# compiled only against a CUDA libtorch (executor/torch_compat.h: make_nccl_group).
set -euo pipefail
GPU_ID=${1:-h100-sxm}
NPROC=${2:-$(nvidia-smi -L | wc -l)}
MODEL=${3:-llama-3.2-1b}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build-gpu
OUT=$ROOT/bench/gpu/out/dist
mkdir -p "$OUT"
export FTPLAN_DATA_DIR=$ROOT
summary=$OUT/summary.txt
: >"$summary"
for strategy in ddp zero1 zero2 zero3 fsdp mp pipeline; do
  echo "== $strategy on $NPROC x $GPU_ID: $MODEL full fine-tuning, bf16, seq 2048, micro-batch 1" | tee -a "$summary"
  "$BUILD/cli/ftplan" plan --model "$MODEL" --gpu "$GPU_ID" --gpus "$NPROC" --method full --precision mixed \
    --seq-len 2048 --micro-batch 1 --grad-accum 4 --strategy "$strategy" --attention fused --checkpointing full \
    -o "$OUT/plan_$strategy.json" >"$OUT/plan_$strategy.txt" || { echo "(planner: does not fit)" | tee -a "$summary"; continue; }
  "$BUILD/executor/ftexec" run "$OUT/plan_$strategy.json" --device cuda --nproc "$NPROC" --steps 10 --warmup 2 \
    --no-progress --timeout-s 300 --out "$OUT/measured_$strategy.json" 2>&1 | tail -3 | tee -a "$summary"
  "$BUILD/cli/ftplan" compare "$OUT/plan_$strategy.json" "$OUT/measured_$strategy.json" | tee -a "$summary" || true
done
echo "per-rank peak memory, DDP vs ZeRO-3: see the 'rank N peak memory' rows above ($summary)"
