#!/usr/bin/env bash
# ftplan memory --json: the output contract other tools rely on (issue 2, item 5), for the flag
# form and the job-file form. Usage: bash memory_json.sh <path-to-ftplan>
SCRIPT=memory_json.sh
source "$(dirname "$0")/lib/harness.sh"

# 1. Flags. Expected figures by hand: Llama-3-8B has 8,030,261,248 parameters; LoRA r=16 on
# q_proj,v_proj trains 32 x 16 x ((4096+4096) + (4096+1024)) = 6,815,744.
"$FTPLAN" memory --model llama-3-8b --method lora --lora-rank 16 --gpu a100-40gb-sxm --gpus 4 \
  --seq-len 1024 --micro-batch 4 --json >"$TMP/flags.json" 2>"$TMP/flags.err"
rc=$?
[ "$rc" -eq 0 ] || fail "memory --json (flags) exited $rc: $(cat "$TMP/flags.err")"
[ -s "$TMP/flags.err" ] && fail "memory --json (flags) wrote to stderr: $(cat "$TMP/flags.err")"

check_json() {  # file, expected trainable count (or -1 to skip), expected strategies (comma list)
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
path, trainable, expected = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
problems = []
try:
    d = json.load(open(path))
except Exception as e:
    print(f"not valid JSON: {e}")
    sys.exit(1)
m = d.get("model", {})
if m.get("params_active") != m.get("params_total"):
    problems.append(f"model.params_active = {m.get('params_active')}, expected params_total {m.get('params_total')} (dense)")
if trainable >= 0:
    if m.get("params_total") != 8030261248:
        problems.append(f"model.params_total = {m.get('params_total')}, expected 8030261248")
    if m.get("params_trainable") != trainable:
        problems.append(f"model.params_trainable = {m.get('params_trainable')}, expected {trainable}")
elif not isinstance(m.get("params_total"), int) or not isinstance(m.get("params_trainable"), int):
    problems.append("model.params_total / params_trainable missing or not integers")
strategies = d.get("strategies")
if not isinstance(strategies, list) or not strategies:
    problems.append("strategies is not a non-empty array")
    strategies = []
names = [s.get("name") for s in strategies]
for want in expected:
    if want not in names:
        problems.append(f"strategy {want!r} missing (have {names})")
for s in strategies:
    mem = s.get("memory_per_gpu_bytes", {})
    for key in ("weights", "gradients", "optimizer", "activations", "overhead", "total"):
        if not isinstance(mem.get(key), int) or mem.get(key) < 0:
            problems.append(f"{s.get('name')}: memory_per_gpu_bytes.{key} = {mem.get(key)!r}")
    if not isinstance(s.get("fits"), bool):
        problems.append(f"{s.get('name')}: fits = {s.get('fits')!r} is not a boolean")
    parts = sum(mem.get(k, 0) for k in ("weights", "gradients", "optimizer", "activations", "logits_loss",
                                         "temporary", "overhead"))
    for key in ("allocated_peak", "reserved_peak", "device_peak"):
        if not isinstance(mem.get(key), int):
            problems.append(f"{s.get('name')}: memory_per_gpu_bytes.{key} = {mem.get(key)!r}")
    if isinstance(mem.get("allocated_peak"), int) and not (mem["allocated_peak"] <= mem["reserved_peak"] <= mem["device_peak"] <= mem["total"]):
        problems.append(f"{s.get('name')}: not allocated <= reserved <= device <= total: {mem}")
    if mem.get("peak_phase") not in ("load", "step", "save") or set(mem.get("phases", {})) != {"load", "step", "save"}:
        problems.append(f"{s.get('name')}: peak_phase / phases missing: {mem.get('peak_phase')!r} {mem.get('phases')!r}")
    if not isinstance(s.get("host_memory_per_node_bytes"), int):
        problems.append(f"{s.get('name')}: host_memory_per_node_bytes missing")
    if isinstance(mem.get("total"), int) and parts != mem["total"]:
        problems.append(f"{s.get('name')}: the parts sum to {parts}, total is {mem['total']}")
    if s.get("fits") is False and "out of memory by" not in s.get("reason", "") and "out of host memory by" not in s.get("reason", ""):
        problems.append(f"{s.get('name')}: fits=false without an 'out of (host) memory by' reason")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
}

out=$(check_json "$TMP/flags.json" 6815744 single,mp,pipeline,ddp,zero1,zero2,zero3,fsdp) ||
  fail "memory --json (flags): $out"

# 2. The job-file form, as a path relative to the repository root and as a short name.
(cd "$FTPLAN_DATA_DIR" && "$FTPLAN" memory configs/jobs/tinyllama-lora-4x-rtx6000ada.json --json) \
  >"$TMP/job.json" 2>"$TMP/job.err"
rc=$?
[ "$rc" -eq 0 ] || fail "memory configs/jobs/tinyllama-lora-4x-rtx6000ada.json --json exited $rc: $(cat "$TMP/job.err")"
out=$(check_json "$TMP/job.json" -1 single,ddp,zero3,fsdp) || fail "memory JOB --json: $out"
# TinyLlama-1.1B: 1,100,048,384 parameters; r=16 on q,v: 22 x 16 x ((2048+2048) + (2048+256)) = 2,252,800.
out=$(python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["model"]
bad = [f"{k} = {m.get(k)}, expected {v}" for k, v in (("params_total", 1100048384), ("params_trainable", 2252800)) if m.get(k) != v]
print("; ".join(bad)); sys.exit(1 if bad else 0)' "$TMP/job.json") || fail "memory JOB --json: $out"

"$FTPLAN" memory tinyllama-lora-4x-rtx6000ada --json >"$TMP/short.json" 2>"$TMP/short.err"
rc=$?
[ "$rc" -eq 0 ] || fail "memory <short job name> --json exited $rc: $(cat "$TMP/short.err")"
cmp -s "$TMP/job.json" "$TMP/short.json" || fail "the job's short name and its path give different output"

# 3. Model families: exact totals against each model's published safetensors count
# (configs/models/SOURCES.md), params_active equal to params_total for dense models.
for pair in qwen3-8b:8190735360 gemma-2-9b:9241705984 gemma-3-4b:4300079472 phi-3-mini-4k:3821079552 \
            olmo-2-7b:7298617344; do
  name=${pair%%:*} want=${pair##*:}
  "$FTPLAN" memory --model "$name" --method lora --lora-targets all-linear --gpu a100-80gb-sxm --json \
    >"$TMP/$name.json" 2>"$TMP/$name.err" || fail "memory --model $name --json exited $?: $(cat "$TMP/$name.err")"
  out=$(python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["model"]
bad = [f"{k} = {m.get(k)}, expected {sys.argv[2]}" for k in ("params_total", "params_active") if m.get(k) != int(sys.argv[2])]
print("; ".join(bad)); sys.exit(1 if bad else 0)' "$TMP/$name.json" "$want") || fail "memory --model $name --json: $out"
done

# Mixtures of experts: the published total and the active count (the routed experts a token does not
# run left out; tests/planner/test_moe.cpp derives each).
for triple in mixtral-8x7b:46702792704:12879925248 qwen3-30b-a3b:30532122624:3353032704 \
              deepseek-v2-lite:15706484224:2661150208; do
  name=${triple%%:*} rest=${triple#*:}
  total=${rest%%:*} active=${rest##*:}
  "$FTPLAN" memory --model "$name" --method lora --lora-targets q_proj --gpu h100-sxm --json \
    >"$TMP/$name.json" 2>"$TMP/$name.err" || fail "memory --model $name --json exited $?: $(cat "$TMP/$name.err")"
  out=$(python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))["model"]
want = {"params_total": int(sys.argv[2]), "params_active": int(sys.argv[3])}
bad = [f"{k} = {m.get(k)}, expected {v}" for k, v in want.items() if m.get(k) != v]
if not m.get("moe") or m["moe"].get("num_experts", 0) < 2: bad.append("no moe object")
print("; ".join(bad)); sys.exit(1 if bad else 0)' "$TMP/$name.json" "$total" "$active") || fail "memory --model $name --json: $out"
done

# 3b. --state-dict: the PEFT docs' Llama-2-70B QLoRA with FSDP-1 offload on 2 H100s, saving a sharded state dict
# under accelerate 0.28 (fsdp-2024): the root unit (1,048,592,384 B) and one block (444,018,688 B) gathered, and
# each rank's chunk of every FlatParameter, 17,741,914,112 B, a second copy on the GPU (planner test "saving a
# sharded state dict"): 19,234,525,184 B more than a local state dict's save, and the run's peak. Every phase
# reports reserved <= device.
for sd in full local sharded; do
  "$FTPLAN" memory --model llama-2-70b --framework fsdp-2024 --fsdp-version 1 --method qlora --lora-rank 8 \
    --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --double-quant --precision bf16 \
    --gpu h100-sxm --gpus 2 --seq-len 2048 --micro-batch 2 --checkpointing full \
    --parallel "dp_shard=2,shard=fsdp,offload=optimizer+params" --state-dict "$sd" --json \
    >"$TMP/sd_$sd.json" 2>"$TMP/sd_$sd.err" || fail "memory --state-dict $sd exited $?: $(cat "$TMP/sd_$sd.err")"
done
out=$(python3 - "$TMP/sd_full.json" "$TMP/sd_local.json" "$TMP/sd_sharded.json" <<'PY'
import json, sys
full, local, sharded = (json.load(open(p))["strategies"][0]["memory_per_gpu_bytes"] for p in sys.argv[1:4])
bad = []
for name, m in (("full", full), ("local", local), ("sharded", sharded)):
    for ph, v in m["phases"].items():
        if not (0 < v["reserved"] <= v["device"]):
            bad.append(f"{name} {ph}: reserved {v['reserved']} not in (0, device {v['device']}]")
diff = sharded["phases"]["save"]["reserved"] - local["phases"]["save"]["reserved"]
if abs(diff - 19234525184) > 2:
    bad.append(f"the sharded save holds {diff} B more than the local one, expected 19234525184")
if (full["peak_phase"], sharded["peak_phase"]) != ("step", "save"):
    bad.append(f"peak phases {full['peak_phase']}, {sharded['peak_phase']}: expected step, save")
if sharded["total"] != sharded["phases"]["save"]["device"]:
    bad.append("total is not the save's device figure")
print("; ".join(bad)); sys.exit(1 if bad else 0)
PY
) || fail "--state-dict: $out"
"$FTPLAN" memory --model llama-3-8b --state-dict bogus >"$TMP/sd_bad.out" 2>&1
[ $? -eq 2 ] || fail "--state-dict bogus did not exit 2"
grep -q -- "--state-dict" "$TMP/sd_bad.out" || fail "--state-dict bogus: the error does not name the flag"

# 3c. The caching allocator's replay (JSON allocator_replay): Liger-Kernel's Qwen2-7B full fine-tune on 4 A100
# 80 GB under transformers 4.43 (hf-2024), FSDP-1 with full checkpointing. At batch 32 the replay runs its 3
# steps; at 48 the figures fit but step 2 cannot place a [tokens, vocab] buffer (planner test "replay:
# fragmentation fails Qwen2-7B at batch 48"): the plan does not fit, and the reason says fragmentation. Under
# ZeRO-3 nothing is replayed: the key is null.
for mb in 32 48; do
  "$FTPLAN" memory --model qwen2-7b --framework hf-2024 --gpus 4 --fsdp-version 1 --strategy fsdp --method full \
    --precision amp --seq-len 512 --micro-batch "$mb" --checkpointing full --headroom 0 --json \
    >"$TMP/replay_$mb.json" 2>"$TMP/replay_$mb.err" || fail "memory (replay, batch $mb) exited $?: $(cat "$TMP/replay_$mb.err")"
done
"$FTPLAN" memory --model qwen2-7b --framework hf-2024 --gpus 4 --strategy zero3 --method full --precision amp \
  --seq-len 512 --micro-batch 32 --checkpointing full --json >"$TMP/replay_zero3.json" 2>&1 || fail "memory (zero3) exited $?"
out=$(python3 - "$TMP/replay_32.json" "$TMP/replay_48.json" "$TMP/replay_zero3.json" <<'PY'
import json, sys
at32, at48, z3 = (json.load(open(p))["strategies"][0] for p in sys.argv[1:4])
bad = []
r32, r48 = at32["memory_per_gpu_bytes"].get("allocator_replay"), at48["memory_per_gpu_bytes"].get("allocator_replay")
if not r32 or r32["oom"] or r32["steps"] != 3 or not (0 < r32["peak_allocated_bytes"] <= r32["peak_reserved_bytes"]):
    bad.append(f"batch 32: {r32!r}")
if not r48 or not r48["oom"] or r48["failed_step"] != 2 or r48["request_bytes"] <= 0:
    bad.append(f"batch 48: {r48!r}")
if "fragmentation" not in at48.get("reason", ""):
    bad.append(f"batch 48 reason: {at48.get('reason')!r}")
if at48["memory_per_gpu_bytes"]["total"] > at48["usable_bytes"]:
    bad.append("batch 48: the figures themselves do not fit (the replay is not what refuses it)")
if z3["memory_per_gpu_bytes"].get("allocator_replay", "absent") is not None:
    bad.append("zero3: allocator_replay is not null")
print("; ".join(bad)); sys.exit(1 if bad else 0)
PY
) || fail "allocator_replay: $out"

# 4. The default output is a table with the assumptions under it.
"$FTPLAN" memory --model llama-3-8b --method lora --gpu a100-40gb-sxm --gpus 4 --seq-len 1024 \
  --micro-batch 4 >"$TMP/table.txt" 2>&1 || fail "memory (table) exited $?"
grep -q "GiB" "$TMP/table.txt" || fail "the table names no GiB unit"
grep -qi "assumptions" "$TMP/table.txt" || fail "the table prints no assumptions"
grep -q "16 B per trainable parameter" "$TMP/table.txt" || fail "the table does not name the 16 B/param convention"

if [ "$failures" -ne 0 ]; then
  echo "memory_json.sh: $failures check(s) failed"
  exit 1
fi
echo "memory_json.sh: all checks passed"
