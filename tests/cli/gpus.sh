#!/usr/bin/env bash
# ftplan gpus (the hwdb catalogue), --price-per-gpu-hour and --version ("Speak the user's stack",
# items 3 and 5): the table lists every hwdb id, --json parses with the documented keys, the price
# flag reaches the plan's cost and assumptions and is refused out of range, a wrong-typed hwdb field
# is one line naming the file and the key with exit 2, and --version prints "ftplan <version>".
# Usage: bash gpus.sh <path-to-ftplan>
SCRIPT=gpus.sh
source "$(dirname "$0")/lib/harness.sh"

"$FTPLAN" gpus >"$TMP/table" 2>"$TMP/err" || fail "ftplan gpus: exit $?: $(cat "$TMP/err")"
for f in "$FTPLAN_DATA_DIR"/hwdb/*.json; do
  id=$(basename "$f" .json)
  grep -q "^$id " "$TMP/table" || fail "ftplan gpus does not list $id"
done
for header in "memory GiB" "bf16 TFLOP/s" "fp8 TFLOP/s" "NVLink domain" "PCIe-only" "GPUs/node" "host GiB/node" \
              "USD/GPU-h" "price read"; do
  head -1 "$TMP/table" | grep -q "$header" || fail "ftplan gpus: no column '$header'"
done

"$FTPLAN" gpus --json >"$TMP/gpus.json" || fail "ftplan gpus --json: exit $?"
out=$(python3 - "$TMP/gpus.json" "$FTPLAN_DATA_DIR/hwdb" <<'PY'
import json, os, re, sys
d = json.load(open(sys.argv[1]))
ids = sorted(f[:-5] for f in os.listdir(sys.argv[2]) if f.endswith(".json"))
problems = []
keys = {"id", "name", "kind", "memory_bytes", "memory_gib", "peak_flops_bf16", "peak_flops_fp8",
        "hbm_bandwidth_bytes_per_s", "nvlink_domain_size", "pcie_only", "gpus_per_node",
        "host_memory_bytes_per_node", "price_usd_per_gpu_hour", "price_date", "price_source",
        "usable_memory_bytes"}
if [g["id"] for g in d["gpus"]] != ids: problems.append("ids differ from hwdb/: %s" % [g["id"] for g in d["gpus"]])
for g in d["gpus"]:
    if set(g) != keys: problems.append(g["id"] + ": keys " + str(sorted(set(g) ^ keys)))
    if not re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])", g["price_date"]): problems.append(g["id"] + ": price_date " + g["price_date"])
    if not 0 < g["usable_memory_bytes"] <= g["memory_bytes"]: problems.append(g["id"] + ": usable memory outside (0, memory]")
    if g["pcie_only"] and g["nvlink_domain_size"] != 1: problems.append(g["id"] + ": PCIe-only with a domain")
    if g["kind"] == "gpu" and not g["price_source"]: problems.append(g["id"] + ": no price source")
h100 = next(g for g in d["gpus"] if g["id"] == "h100-sxm")
if h100["memory_bytes"] != 81559 * 2**20: problems.append("h100-sxm memory is not nvidia-smi's 81559 MiB")
if h100["usable_memory_bytes"] != 81009 * 2**20: problems.append("h100-sxm usable memory is not torch's 79.11 GiB (81009 MiB)")
nvl = next(g for g in d["gpus"] if g["id"] == "gb200-nvl72")
if nvl["nvlink_domain_size"] != 72: problems.append("gb200-nvl72: domain %d" % nvl["nvlink_domain_size"])
print("; ".join(problems))
sys.exit(1 if problems else 0)
PY
) || fail "gpus --json: $out"

# --price-per-gpu-hour: the plan's cost is GPU-hours x the price given, and the assumptions say so.
job=(--model tinyllama-1.1b --method lora --gpu h100-sxm --gpus 2 --seq-len 512 --micro-batch 4 --dataset-rows 1000)
"$FTPLAN" plan "${job[@]}" --price-per-gpu-hour 7.5 --json >"$TMP/plan.json" || fail "plan --price-per-gpu-hour: exit $?"
out=$(python3 - "$TMP/plan.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
problems = []
if d["gpu"]["price_usd_per_gpu_hour"] != 7.5: problems.append("gpu.price_usd_per_gpu_hour %r" % d["gpu"]["price_usd_per_gpu_hour"])
if d["gpu"]["price_source"] != "--price-per-gpu-hour": problems.append("price_source " + d["gpu"]["price_source"])
for s in d["strategies"]:
    if s["fits"] and abs(s["cost_usd"] - s["gpu_hours"] * 7.5) > 1e-9 * s["cost_usd"]:
        problems.append("%s: cost %r != gpu_hours x 7.5" % (s["name"], s["cost_usd"]))
if not any("--price-per-gpu-hour" in a for a in d["assumptions"]): problems.append("no assumption names the flag")
print("; ".join(problems))
sys.exit(1 if problems else 0)
PY
) || fail "plan --price-per-gpu-hour: $out"
"$FTPLAN" plan "${job[@]}" >"$TMP/plan.txt" || fail "plan: exit $?"
grep -q "price: 2.69 USD per GPU-hour (hwdb h100-sxm, indicative on-demand, read 2026-07" "$TMP/plan.txt" ||
  fail "plan without the flag does not name the hwdb price and its date: $(grep price "$TMP/plan.txt")"
for bad in 0 -1 abc 1e7; do
  "$FTPLAN" plan "${job[@]}" --price-per-gpu-hour "$bad" >/dev/null 2>"$TMP/err"; rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "--price-per-gpu-hour" "$TMP/err" ||
    fail "--price-per-gpu-hour $bad: exit $rc, $(cat "$TMP/err")"
done
"$FTPLAN" sweep --help >"$TMP/help"
grep -q -- "--price-per-gpu-hour" "$TMP/help" && grep -q "every GPU" "$TMP/help" ||
  fail "sweep --help does not say the price applies to every GPU type"
grep -q -- "--gpu TEXT.*(default a100-80gb-sxm)" "$TMP/help" || fail "sweep --help shows no default for --gpu"
# In a job file the same key is read, and the same range refused, naming the file and the key.
printf '{"model": "tinyllama-1.1b", "gpu": "l40s", "price_per_gpu_hour": "cheap"}\n' >"$TMP/job.json"
"$FTPLAN" memory "$TMP/job.json" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q "job.json: price_per_gpu_hour: expected a number" "$TMP/err" ||
  fail "job file price_per_gpu_hour \"cheap\": exit $rc, $(cat "$TMP/err")"

# A user's hwdb file with a value of the wrong type: one line naming the file and the key, exit 2.
python3 - "$FTPLAN_DATA_DIR/hwdb/l40s.json" "$TMP/my-gpu.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["pcie_only"] = "yes"; json.dump(d, open(sys.argv[2], "w"))
PY
"$FTPLAN" memory --model tinyllama-1.1b --gpu "$TMP/my-gpu.json" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "my-gpu.json: pcie_only: expected true or false" "$TMP/err" ||
  fail "wrong-typed hwdb field: exit $rc, $(cat "$TMP/err")"

# --version: "ftplan <version>", exit 0, with or without a subcommand's arguments around it.
"$FTPLAN" --version >"$TMP/v" 2>&1; rc=$?
[ $rc -eq 0 ] && grep -Eq '^ftplan [0-9]+\.[0-9]+' "$TMP/v" || fail "ftplan --version: exit $rc, '$(cat "$TMP/v")'"
"$FTPLAN" --help | grep -q -- "--version" || fail "ftplan --help does not list --version"

if [ "$failures" -ne 0 ]; then
  echo "gpus.sh: $failures check(s) failed"
  exit 1
fi
echo "gpus.sh: all checks passed"
