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
        "usable_memory_bytes", "pcie_slot"}
if [g["id"] for g in d["gpus"]] != ids: problems.append("ids differ from hwdb/: %s" % [g["id"] for g in d["gpus"]])
for g in d["gpus"]:
    if set(g) != keys: problems.append(g["id"] + ": keys " + str(sorted(set(g) ^ keys)))
    if not re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])", g["price_date"]): problems.append(g["id"] + ": price_date " + g["price_date"])
    if not 0 < g["usable_memory_bytes"] <= g["memory_bytes"]: problems.append(g["id"] + ": usable memory outside (0, memory]")
    if g["pcie_only"] and g["nvlink_domain_size"] != 1: problems.append(g["id"] + ": PCIe-only with a domain")
    if g["kind"] == "gpu" and not g["price_source"]: problems.append(g["id"] + ": no price source")
    if g["pcie_only"] and not re.fullmatch(r"[1-6]x(1|2|4|8|16)", g["pcie_slot"] or ""): problems.append(g["id"] + ": PCIe-only without its slot")
h100 = next(g for g in d["gpus"] if g["id"] == "h100-sxm")
if h100["memory_bytes"] != 81559 * 2**20: problems.append("h100-sxm memory is not nvidia-smi's 81559 MiB")
if h100["pcie_slot"] != "5x16": problems.append("h100-sxm pcie_slot is not its datasheet's PCIe Gen5 x16")
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

# --pcie-slot: a narrower slot slows what crosses PCIe (FSDP's gathers on host-staged GeForce cards), the plan
# JSON names both slots, the assumptions say so; a malformed slot, a faster one, or a card without one: exit 2.
slot=(--model llama-2-7b --method lora --gpu rtx-3090 --gpus 2 --strategy fsdp --micro-batch 1 --checkpointing full --seq-len 512)
"$FTPLAN" plan "${slot[@]}" --json >"$TMP/x16.json" || fail "plan without --pcie-slot: exit $?"
"$FTPLAN" plan "${slot[@]}" --pcie-slot 3x8 --json >"$TMP/x8.json" || fail "plan --pcie-slot 3x8: exit $?"
out=$(python3 - "$TMP/x16.json" "$TMP/x8.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
problems = []
if (a["gpu"]["pcie_slot"], a["gpu"]["pcie_link"], a["gpu"]["hwdb_pcie_slot"]) != ("4x16", "4x16", "4x16"): problems.append("default slots %r" % a["gpu"])
if (b["gpu"]["pcie_slot"], b["gpu"]["pcie_link"], b["gpu"]["hwdb_pcie_slot"]) != ("3x8", "3x8", "4x16"): problems.append("3x8 slots %r" % b["gpu"])
if b["gpu"]["pcie_host_bandwidth_bytes_per_s"] * 4 != a["gpu"]["pcie_host_bandwidth_bytes_per_s"]: problems.append("host copies not at a quarter")
sa, sb = a["strategies"][0], b["strategies"][0]
if sb["comm_bytes_per_step"] != sa["comm_bytes_per_step"]: problems.append("the bytes moved changed")
if not sb["step_time_s"] > 2 * sa["step_time_s"]: problems.append("step %r s at 3x8 vs %r s at 4x16: gathers not slower" % (sb["step_time_s"], sa["step_time_s"]))
if not any("PCIe link 3.0 x8 (the card's 4.0 x16 in 3.0 x8 slots, --pcie-slot)" in x for x in b["assumptions"]): problems.append("no assumption names the slot")
print("; ".join(problems))
sys.exit(1 if problems else 0)
PY
) || fail "plan --pcie-slot: $out"
for bad in 3x7 7x16 x8 abc 0x16; do
  "$FTPLAN" plan "${slot[@]}" --pcie-slot "$bad" >/dev/null 2>"$TMP/err"; rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "--pcie-slot" "$TMP/err" ||
    fail "--pcie-slot $bad: exit $rc, $(cat "$TMP/err")"
done
printf '{"model": "tinyllama-1.1b", "gpu": "gh200", "pcie_slot": "4x16"}\n' >"$TMP/job.json"
"$FTPLAN" memory "$TMP/job.json" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "pcie_slot" "$TMP/err" && grep -q "states no PCIe slot" "$TMP/err" ||
  fail "pcie_slot on gh200 in a job file: exit $rc, $(cat "$TMP/err")"

# --version: "ftplan <version>", exit 0, with or without a subcommand's arguments around it.
"$FTPLAN" --version >"$TMP/v" 2>&1; rc=$?
[ $rc -eq 0 ] && grep -Eq '^ftplan [0-9]+\.[0-9]+' "$TMP/v" || fail "ftplan --version: exit $rc, '$(cat "$TMP/v")'"
"$FTPLAN" --help | grep -q -- "--version" || fail "ftplan --help does not list --version"

if [ "$failures" -ne 0 ]; then
  echo "gpus.sh: $failures check(s) failed"
  exit 1
fi
echo "gpus.sh: all checks passed"
