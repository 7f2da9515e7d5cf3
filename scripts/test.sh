#!/usr/bin/env bash
# Runs every test (Catch2 binaries with --order rand --warn NoAssertions, and the CLI scripts) via
# ctest on the build that scripts/setup.sh made.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure "$@"
