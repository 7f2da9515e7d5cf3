#!/usr/bin/env bash
# Step-time error of `ftplan`'s prediction for the host CPU (hwdb/cpu.json) before and after
# calibration, over seven shapes (hidden size 128 .. 1024, sequence length 128 .. 1024, full and LoRA):
#   1. ftexec trains each shape on the CPU (fp32, eager attention, one process) and measures its step time;
#   2. `ftexec calibrate` times GEMMs, attention and the optimizer on this CPU (at a middle shape);
#   3. `ftplan calibrate --leave-one-out` predicts each run from a fit on the other runs only,
#      starting once from the hwdb's figures and once from step 2's measurement.
# Prints the per-run table and the mean |error| of each; writes everything under OUT (default
# build/bench-calibrate). Usage: bench/calibrate_cpu.sh [OUT]   (about 3-5 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/bench-calibrate}
mkdir -p "$out"
ftexec=build/executor/ftexec
ftplan=build/cli/ftplan
threads=${FTPLAN_BENCH_THREADS:-0}

# name  model                       method  seq   micro-batch  lora rank
shapes=(
  "h128-full-s128    bench/models/cpu-h128.json  full 128  4 0"
  "h256-lora-s256    bench/models/cpu-h256.json  lora 256  2 8"
  "h256-full-s1024   bench/models/cpu-h256.json  full 1024 1 0"
  "h512-full-s128    bench/models/cpu-h512.json  full 128  4 0"
  "h512-lora-s512    bench/models/cpu-h512.json  lora 512  1 16"
  "h768-full-s256    bench/models/cpu-h768.json  full 256  2 0"
  "h1024-lora-s128   bench/models/cpu-h1024.json lora 128  2 8"
)
runs=()
for line in "${shapes[@]}"; do
  read -r name model method seq mb rank <<<"$line"
  lora=()
  [ "$method" = lora ] && lora=(--lora-rank "$rank")
  "$ftexec" run --model "$model" --method "$method" "${lora[@]}" --seq-len "$seq" --micro-batch "$mb" \
    --precision fp32 --attention eager --steps 8 --warmup 3 --threads "$threads" --gpu cpu --device cpu \
    --no-progress --out "$out/$name.json" >/dev/null
  runs+=("$out/$name.json")
  echo "measured $name: $(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['step_time_s'], 4))" "$out/$name.json") s"
done

"$ftexec" calibrate --model bench/models/cpu-h512.json --method lora --lora-rank 16 --seq-len 256 --micro-batch 2 \
  --precision fp32 --attention eager --threads "$threads" --gpu cpu --device cpu --out "$out/ftexec-calibration.json"

"$ftplan" calibrate "${runs[@]}" --leave-one-out --json -o "$out/fit-hwdb-prior.json" >"$out/loo-hwdb-prior.json"
"$ftplan" calibrate "${runs[@]}" --leave-one-out --json --prior "$out/ftexec-calibration.json" \
  -o "$out/fit-ftexec-prior.json" >"$out/loo-ftexec-prior.json"

python3 - "$out" <<'EOF'
import json, sys, os
out = sys.argv[1]
a = json.load(open(os.path.join(out, "loo-hwdb-prior.json")))["leave_one_out"]
b = json.load(open(os.path.join(out, "loo-ftexec-prior.json")))["leave_one_out"]
print()
print("step-time error of ftplan's prediction for the host CPU, (predicted - measured) / measured")
print(f"{'run':<18} {'measured_s':>10} {'hwdb':>8} {'ftexec calibrate':>17} {'LOO fit (hwdb prior)':>21} {'LOO fit (ftexec prior)':>23}")
for ra, rb in zip(a["runs"], b["runs"]):
    name = os.path.basename(ra["path"]).removesuffix(".json")
    print(f"{name:<18} {ra['measured_step_s']:>10.4f} {ra['before_error_pct']:>7.1f}% {rb['before_error_pct']:>16.1f}% "
          f"{ra['after_error_pct']:>20.1f}% {rb['after_error_pct']:>22.1f}%")
print(f"{'mean |error|':<18} {'':>10} {a['mape_before_pct']:>7.1f}% {b['mape_before_pct']:>16.1f}% "
      f"{a['mape_after_pct']:>20.1f}% {b['mape_after_pct']:>22.1f}%")
print(f"runs predicted worse after the fit: {a['worse_runs']} (hwdb prior), {b['worse_runs']} (ftexec prior)")
EOF
