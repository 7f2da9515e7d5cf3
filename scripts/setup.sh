#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: install every dependency from Debian's archive, build
# ftplan, ftexec, the tests and benchmarks, then run the main job on a shipped example.
#   scripts/setup.sh                 # everything (needs LibTorch: libtorch-dev)
#   FTPLAN_PLANNER_ONLY=1 scripts/setup.sh   # planner and simulator only, no LibTorch
set -euo pipefail
cd "$(dirname "$0")/.."

# chromium and fonts-dejavu-core: tests/cli/report.sh renders ftplan report's page in headless chromium.
packages=(build-essential cmake ninja-build pkg-config python3
          nlohmann-json3-dev libcli11-dev libboost-graph-dev libyaml-cpp-dev catch2 libbenchmark-dev
          chromium fonts-dejavu-core)
if [ "${FTPLAN_PLANNER_ONLY:-0}" != 1 ]; then
  # LibTorch 1.13 (CPU) with Gloo for c10d; OpenBLAS because the reference BLAS is ~20x slower;
  # zlib for the checkpoints' CRC-32 checksums; PyTorch for Python (the same 1.13) runs
  # tests/reference/llama_reference.py, the independent reference the executor tests compare ftexec
  # with, and bench/reference_cpu.py.
  packages+=(libtorch-dev libgloo-dev libopenblas0-pthread zlib1g-dev python3-torch)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

executor=ON
[ "${FTPLAN_PLANNER_ONLY:-0}" = 1 ] && executor=OFF
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFTPLAN_BUILD_EXECUTOR=$executor
# LibTorch translation units take ~1 GB of memory each: two at a time on a 2-core, 24 GiB machine.
cmake --build build -j "$(nproc)"

echo
echo "== main job: ftplan plan configs/jobs/llama-3-8b-instruct-lora-a100-40gb.json =="
build/cli/ftplan plan configs/jobs/llama-3-8b-instruct-lora-a100-40gb.json
