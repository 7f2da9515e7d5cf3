#!/usr/bin/env bash
# `ftplan calibrate` and `--calibration` (issue 17): a fit from measured runs written and applied,
# leave-one-out printed, and the bad inputs refused in one line with exit 2.
# Usage: bash calibrate.sh <path-to-ftplan>
SCRIPT=calibrate.sh
source "$(dirname "$0")/lib/harness.sh"

expect_bad() {
  local name=$1 field=$2
  shift 2
  "$FTPLAN" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [ "$rc" -eq 2 ] || fail "$name: exit code $rc, expected 2 (ftplan $*); stderr: $(cat "$TMP/err")"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$name: expected one line on stderr: $(cat "$TMP/err")"
  grep -qF -- "$field" "$TMP/err" || fail "$name: stderr does not name '$field': $(cat "$TMP/err")"
}

# Three "measured" runs of the tiny model on the host CPU, made from plans (their job and candidate
# as ftexec writes them), each 4x slower than the hwdb's figures predict.
i=0
for shape in "full 128 2" "lora 256 4" "full 512 1"; do
  read -r method seq mb <<<"$shape"
  "$FTPLAN" plan --model tiny-test --gpu cpu --framework ftexec --precision fp32 --method "$method" --seq-len "$seq" \
    --micro-batch "$mb" --strategy single --attention eager -o "$TMP/plan$i.json" >/dev/null || fail "plan $shape"
  python3 - "$TMP/plan$i.json" "$TMP/run$i.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
m = {"format": "ftexec-measured/1", "framework": "ftexec", "device": "cpu", "job": p["job"],
     "candidate": p["candidate"], "step_time_s": 4 * p["predicted"]["step_time_s"], "ranks": []}
json.dump(m, open(sys.argv[2], "w"))
PY
  i=$((i + 1))
done

"$FTPLAN" calibrate "$TMP/run0.json" "$TMP/run1.json" "$TMP/run2.json" -o "$TMP/cal.json" --leave-one-out >"$TMP/out" 2>&1 ||
  fail "calibrate: $(cat "$TMP/out")"
grep -q "leave-one-out" "$TMP/out" || fail "calibrate: no leave-one-out table: $(cat "$TMP/out")"
grep -q "mean |error|" "$TMP/out" || fail "calibrate: no mean error: $(cat "$TMP/out")"
python3 - "$TMP/cal.json" <<'PY' || fail "calibration file"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["format"] == "ftplan-calibration/1", c["format"]
assert c["device"] == "cpu"
g = c["parameters"]["gemm_efficiency"]
# 4x slower than the hwdb's 0.3 everywhere: the fitted efficiency about 0.075 where the tiny model's
# GEMMs are (smallest dimension <= 256); the anchors no GEMM reaches stay at the prior, not determined.
assert 0.05 < g["64"] < 0.1, g
assert g["4096"] == 0.3 and "gemm_efficiency.4096" not in c["determined"], (g, c["determined"])
assert sorted(g) == ["16", "4096", "512", "64"], g
assert "gemm_efficiency.64" in c["determined"] and "attention_efficiency" in c["determined"], c["determined"]
assert "link_bandwidth_factor.intra_node" not in c["determined"], c["determined"]
PY
# The calibrated plan predicts the "measured" time (4x the hwdb's) and says it is calibrated.
"$FTPLAN" plan --model tiny-test --gpu cpu --framework ftexec --precision fp32 --method full --seq-len 128 \
  --micro-batch 2 --strategy single --attention eager --calibration "$TMP/cal.json" --json >"$TMP/calplan.json" ||
  fail "plan --calibration"
python3 - "$TMP/calplan.json" "$TMP/run0.json" <<'PY' || fail "calibrated prediction"
import json, sys
p = json.load(open(sys.argv[1])); m = json.load(open(sys.argv[2]))
assert p["calibration"]["device"] == "cpu", p.get("calibration")
t = p["candidates"][0]["step_time_s"]
assert abs(t - m["step_time_s"]) / m["step_time_s"] < 0.15, (t, m["step_time_s"])
PY
"$FTPLAN" plan --model tiny-test --gpu cpu --precision fp32 --calibration "$TMP/cal.json" >"$TMP/out" || fail "plan table"
grep -q "calibrated" "$TMP/out" || fail "plan: the table does not say it is calibrated"
for cmd in check simulate; do
  "$FTPLAN" $cmd --model tiny-test --gpu cpu --precision fp32 --strategy single --calibration "$TMP/cal.json" >"$TMP/out" 2>&1
  grep -q "calibrated" "$TMP/out" || fail "$cmd: does not say it is calibrated: $(head -c 300 "$TMP/out")"
done
"$FTPLAN" sweep --model tiny-test --gpu cpu --gpu-types cpu --gpu-counts 1 --precision fp32 --calibration "$TMP/cal.json" >"$TMP/out" 2>&1
grep -q "calibrated" "$TMP/out" || fail "sweep: does not say it is calibrated"

# Bad input.
expect_bad "calibration for another GPU" "device \"cpu\"" plan --model tiny-test --gpu h100-sxm --calibration "$TMP/cal.json"
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["parameters"]["gemm_efficiency"]["512"]=2; json.dump(c, open(sys.argv[2],"w"))' \
  "$TMP/cal.json" "$TMP/bad-cal.json"
expect_bad "efficiency above 1" "gemm_efficiency" plan --model tiny-test --gpu cpu --calibration "$TMP/bad-cal.json"
expect_bad "missing calibration file" "no-such.json" plan --model tiny-test --gpu cpu --calibration "$TMP/no-such.json"
echo '{"hello": 1}' >"$TMP/unknown.json"
expect_bad "log of an unknown format" "unknown.json" calibrate "$TMP/unknown.json"
expect_bad "trainer_state without its plan" "--plan" calibrate "$FTPLAN_DATA_DIR/tests/data/logs/hf_tinyllama_qlora_trainer_state.json"
expect_bad "a run of another job than --plan" "seq_len" calibrate "$TMP/run2.json" --plan "$TMP/plan0.json"
"$FTPLAN" calibrate "$TMP/run2.json" --plan "$TMP/plan0.json" --force >/dev/null 2>&1 || fail "--force: a differing run is used"
expect_bad "leave-one-out of one run" "at least 2 runs" calibrate "$TMP/run0.json" --leave-one-out
expect_bad "a prior for another device" "device" calibrate "$TMP/run0.json" --prior "$TMP/cal.json" --gpu h100-sxm

# ftexec calibrate on this CPU: two ranks (Gloo), the same file format, usable by --calibration.
if [ -n "${FTEXEC:-}" ]; then
  "$FTEXEC" calibrate --model tiny-test --method lora --seq-len 64 --micro-batch 2 --precision fp32 --attention eager \
    --gpu cpu --device cpu --threads 1 --nproc 2 -o "$TMP/measured-cal.json" >"$TMP/out" 2>&1 || fail "ftexec calibrate: $(cat "$TMP/out")"
  python3 - "$TMP/measured-cal.json" <<'PY' || fail "ftexec calibrate: the file"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["format"] == "ftplan-calibration/1" and c["device"] == "cpu" and c["method"] == "measured", c
p = c["parameters"]
assert sorted(p["gemm_efficiency"]) == ["16", "4096", "512", "64"], p
assert all(0 < v <= 1 for v in p["gemm_efficiency"].values()), p
assert 0 < p["attention_efficiency"] <= 1 and 0 < p["optimizer_bandwidth_factor"], p
sizes = [g["ranks"] for g in c["details"]["all_reduce"]["per_group_size"]]
assert sizes == [2], sizes
assert c["parameters"]["comm_latency_s"] > 0 and "comm_latency_s" in c["determined"], c["determined"]
assert len(c["details"]["gemm"]) > 20, len(c["details"]["gemm"])
PY
  "$FTPLAN" plan --model tiny-test --gpu cpu --precision fp32 --calibration "$TMP/measured-cal.json" >"$TMP/out" 2>&1 ||
    fail "plan with ftexec calibrate's file: $(cat "$TMP/out")"
  "$FTEXEC" calibrate --model tiny-test --seq-len 64 --gpu a100-81gb -o "$TMP/x.json" >"$TMP/out" 2>"$TMP/err"
  [ $? -eq 2 ] && grep -q -- "a100-81gb" "$TMP/err" || fail "ftexec calibrate: an unknown --gpu is not one line exit 2: $(cat "$TMP/err")"
  "$FTEXEC" calibrate --model tiny-test --seq-len 64 --gpu cpu --device cpu -o "$TMP/no-such-dir/x.json" >"$TMP/out" 2>"$TMP/err"
  [ $? -eq 2 ] && grep -q -- "--out" "$TMP/err" || fail "ftexec calibrate: an unwritable --out is not one line exit 2: $(cat "$TMP/err")"
fi

if [ "$failures" -ne 0 ]; then
  echo "calibrate.sh: $failures check(s) failed"
  exit 1
fi
echo "calibrate.sh: all checks passed"
