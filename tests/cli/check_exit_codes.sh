#!/usr/bin/env bash
# ftplan check, the CI gate (issue 3, item 6): exit 0 when the recommended plan meets every limit,
# 1 when it violates one (naming which and by how much), 2 on bad input.
# Usage: bash check_exit_codes.sh <path-to-ftplan>
SCRIPT=check_exit_codes.sh
source "$(dirname "$0")/lib/harness.sh"

JOB="$FTPLAN_DATA_DIR/configs/jobs/tinyllama-lora-4x-rtx6000ada.json"

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
expect_out() {  # what, pattern (fixed string) in stdout
  grep -qF -- "$2" "$TMP/out" || fail "$1: stdout does not contain '$2': $(head -c 2000 "$TMP/out")"
}

# Generous limits: the TinyLlama seed job takes well under a minute and cents (job file's dataset).
if run 0 "generous limits" check "$JOB" --max-hours 100 --max-cost 1000 --max-memory-fraction 1; then
  expect_out "generous limits" "check passed"
  grep -q "^FAIL" "$TMP/out" && fail "generous limits: a FAIL line in a passing check"
fi

# A tiny time limit: violated, named, with the excess.
if run 1 "--max-hours 0.0001" check "$JOB" --max-hours 0.0001; then
  expect_out "--max-hours 0.0001" "FAIL time"
  expect_out "--max-hours 0.0001" "over by"
fi

# A tiny cost limit.
if run 1 "--max-cost 0.000001" check "$JOB" --max-cost 0.000001; then
  expect_out "--max-cost 0.000001" "FAIL cost"
  expect_out "--max-cost 0.000001" "over by"
fi

# 1% of GPU memory: no plan uses that little.
if run 1 "--max-memory-fraction 0.01" check "$JOB" --max-memory-fraction 0.01; then
  expect_out "--max-memory-fraction 0.01" "FAIL memory"
  expect_out "--max-memory-fraction 0.01" "over by"
fi

# Two violations are both reported.
if run 1 "two limits violated" check "$JOB" --max-hours 0.0001 --max-memory-fraction 0.01; then
  expect_out "two limits violated" "2 limit(s) violated"
fi

# Bad input: exit 2 with one line on stderr naming the option.
for args in "--max-cost -5" "--max-hours 0" "--max-memory-fraction 1.5" "--max-hours abc"; do
  # shellcheck disable=SC2086
  if run 2 "check $args" check "$JOB" $args; then
    option=${args%% *}
    grep -qF -- "$option" "$TMP/err" || fail "check $args: stderr does not name $option: $(cat "$TMP/err")"
    [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "check $args: stderr is not one line: $(cat "$TMP/err")"
  fi
done
# Time and cost limits need a dataset to be checked.
if run 2 "--max-hours without a dataset" check --model llama-3-8b --method lora --gpu a100-80gb-sxm --max-hours 1; then
  grep -qF -- "--max-hours" "$TMP/err" || fail "--max-hours without a dataset: stderr does not name it"
fi

# A job that fits nowhere: Llama-3.1-70B full FT at 16k tokens per sample on one RTX 3090
# (the loss alone is 12 x 16384 x 128256 B = 25.2 GB). Exit 1, naming memory.
if run 1 "fits nowhere" check --model llama-3.1-70b --method full --gpu rtx-3090 --gpus 1 --seq-len 16384 \
  --dataset-rows 100; then
  expect_out "fits nowhere" "FAIL memory"
  expect_out "fits nowhere" "out of memory by"
fi

if [ "$failures" -ne 0 ]; then
  echo "check_exit_codes.sh: $failures check(s) failed"
  exit 1
fi
echo "check_exit_codes.sh: all checks passed"
