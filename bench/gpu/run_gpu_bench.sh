#!/usr/bin/env bash
# GPU benchmark for ftexec (issue 5): Llama-3.2-1B-shaped LoRA and full fine-tuning in bf16 at
# sequence length 2048, predicted (ftplan) vs measured (ftexec) peak memory and step time, and
# tokens/s + peak memory side by side with Hugging Face transformers + PEFT on the same GPU, shape,
# batch and sequence length.
#
# Usage, from the repository root on a machine with an NVIDIA GPU:
#   python3 -m pip install torch transformers peft      # a PyTorch 2.x wheel with CUDA
#   bash bench/gpu/run_gpu_bench.sh [GPU_ID] [MICRO_BATCH] [STEPS]
#     GPU_ID       hwdb id for the prediction and the MFU, e.g. h100-sxm (default), a100-80gb-sxm, h200
#     MICRO_BATCH  samples per step (default 4)     STEPS  optimizer steps (default 20, 3 warm-up)
# Header-only dependencies (nlohmann-json, CLI11, Boost) come from the system or from
# .deps/prefix/usr. Results land in bench/gpu/out/: plan_*.json, measured_*.json, hf_*.json and
# summary.txt.
set -euo pipefail

GPU_ID=${1:-h100-sxm}
MB=${2:-4}
STEPS=${3:-20}
WARMUP=3
SEQ=2048
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/bench/gpu/out
BUILD=$ROOT/build-gpu
mkdir -p "$OUT"
export FTPLAN_DATA_DIR=$ROOT

# 1. Build ftplan + ftexec against the wheel's libtorch. Wheels before 2.7 use the old C++ ABI:
#    then the whole project must too, or std::string crosses the library boundary wrongly.
TORCH_PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
ABI=$(python3 -c 'import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFTPLAN_BUILD_BENCH=OFF -DFTPLAN_BUILD_TESTS=OFF \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$ROOT/.deps/prefix/usr" \
  -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$ABI -isystem $ROOT/.deps/prefix/usr/include" >"$OUT/cmake.log"
cmake --build "$BUILD" -j"$(nproc)" --target ftplan ftexec >"$OUT/build.log"
grep -q "LibTorch with CUDA" "$OUT/cmake.log" || { echo "libtorch without CUDA: see $OUT/cmake.log" >&2; exit 1; }

summary=$OUT/summary.txt
: >"$summary"
run_case() {  # name method extra-ftplan-flags
  local name=$1 method=$2
  shift 2
  echo "== $name: $method, bf16, seq $SEQ, micro-batch $MB on $GPU_ID" | tee -a "$summary"
  "$BUILD/cli/ftplan" plan --model llama-3.2-1b --gpu "$GPU_ID" --method "$method" --precision bf16 \
    --seq-len "$SEQ" --micro-batch "$MB" --strategy single --attention fused --checkpointing none "$@" \
    -o "$OUT/plan_$name.json" >"$OUT/plan_$name.txt"
  "$BUILD/executor/ftexec" run "$OUT/plan_$name.json" --device cuda --gpu "$GPU_ID" --steps "$STEPS" \
    --warmup "$WARMUP" --no-progress --out "$OUT/measured_$name.json"
  "$BUILD/cli/ftplan" compare "$OUT/plan_$name.json" "$OUT/measured_$name.json" | tee -a "$summary" || true
  local hf_args=(--method "$method" --seq-len "$SEQ" --micro-batch "$MB" --steps "$STEPS" --warmup "$WARMUP"
                 --precision bf16 --out "$OUT/hf_$name.json")
  if [ "$method" = lora ]; then hf_args+=(--lora-rank 16 --lora-alpha 32 --lora-targets q_proj,v_proj); fi
  python3 "$ROOT/bench/gpu/hf_peft_compare.py" --config "$ROOT/configs/models/llama-3.2-1b.json" "${hf_args[@]}" >/dev/null
  python3 - "$OUT/measured_$name.json" "$OUT/hf_$name.json" <<'PY' | tee -a "$summary"
import json, sys
m, h = (json.load(open(p)) for p in sys.argv[1:3])
r = m["ranks"][0]
c = r.get("cuda", {})
gib = 2.0 ** 30
print(f"{'':28s}{'ftexec':>14s}{'HF+PEFT':>14s}{'ftexec/HF':>11s}")
rows = [("tokens/s", m["tokens_per_s"], h["tokens_per_s"], "{:,.0f}"),
        ("step time (s)", m["step_time_s"], h["step_time_s"], "{:.4f}"),
        ("peak allocated (GiB)", c.get("peak_allocated_bytes", 0) / gib, h["peak_allocated_bytes"] / gib, "{:.2f}"),
        ("peak reserved (GiB)", c.get("peak_reserved_bytes", 0) / gib, h["peak_reserved_bytes"] / gib, "{:.2f}"),
        ("device in use (GiB)", c.get("device_used_bytes", 0) / gib, h["device_used_bytes"] / gib, "{:.2f}")]
for name, a, b, fmt in rows:
    ratio = a / b if b else float("nan")
    print(f"{name:28s}{fmt.format(a):>14s}{fmt.format(b):>14s}{ratio:>11.3f}")
print(f"loss first/last: ftexec {m['loss'][0]:.4f}/{m['loss'][-1]:.4f}, HF {h['loss'][0]:.4f}/{h['loss'][-1]:.4f}")
PY
}

run_case lora lora --lora-rank 16 --lora-alpha 32 --lora-targets q_proj,v_proj
run_case full full
echo "summary: $summary"
