#!/usr/bin/env python3
"""Check configs/validation/published.json, the validation suite of published measurements.

Checks that the file loads; that every source and case has its required keys and no others; that every
job uses only ftplan job-file keys with valid values; that the models and GPUs of expressible cases exist
(configs/models/<name>.json, hwdb/<id>.json); that each published figure converts exactly to
peak_memory_bytes with its source's unit; that OOM-boundary pairs are symmetric. Prints the totals.

    configs/validation/check_suite.py [SUITE] [--ftplan build/cli/ftplan [--data-dir DIR] [--all-keys]]

--ftplan also runs `ftplan memory` on each expressible job (FTPLAN_DATA_DIR = this checkout unless
--data-dir), reduced to the job keys of the HEAD reader unless --all-keys, to check that the jobs, models and
GPUs load.
Exit status: 0 when there is no error, 1 otherwise.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from decimal import Decimal, ROUND_HALF_EVEN

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOP_KEYS = {"format", "description", "thresholds", "guards", "sources", "cases"}
THRESHOLD_KEYS = {"memory_mape_pct", "throughput_mape_pct", "min_cases_per_source", "oom_boundary_calls_right"}
SOURCE_KEYS = ["title", "organisation", "url", "metric", "metric_evidence", "unit", "caveats"]
METRICS = {"allocated", "reserved", "active", "device", "unknown"}
UNITS = {"GiB": Decimal(2 ** 30), "GB": Decimal(10 ** 9), "MiB": Decimal(2 ** 20), "bytes": Decimal(1)}
CASE_REQUIRED = ["id", "source", "url", "quote", "job", "measured", "oom_boundary", "expressible", "notes"]
CASE_OPTIONAL = ["not_expressible_because", "exclude", "exclude_because"]
MEASURED_KEYS = ["peak_memory_bytes", "published", "metric", "oom", "tokens_per_s_per_gpu", "step_time_s"]

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STRATEGIES = {"single", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp_shard_grad_op", "fsdp_hybrid",
              "zero2_offload", "zero3_offload", "mp", "pipeline", "pipeline_1f1b"}
FSDP_STRATEGIES = {"fsdp", "fsdp_shard_grad_op", "fsdp_hybrid"}
DEEPSPEED_STRATEGIES = {"zero1", "zero2", "zero3", "zero2_offload"}
# The framework profiles ftplan ships: one file per framework (configs/frameworks/NAME.json).
FRAMEWORKS = {f[:-len(".json")] for f in os.listdir(os.path.join(ROOT, "configs", "frameworks")) if f.endswith(".json")}
MAX_TOKENS = 2 ** 24


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_bool(v):
    return isinstance(v, bool)


def int_in(lo, hi):
    return lambda v: is_int(v) and lo <= v <= hi


def one_of(*choices):
    return lambda v: isinstance(v, str) and v in choices


def check_lora(v, errors, where):
    if not isinstance(v, dict):
        errors.append(f"{where}: lora: expected an object")
        return
    unknown = set(v) - {"rank", "alpha", "dropout", "targets"}
    if unknown:
        errors.append(f"{where}: lora: unknown keys {sorted(unknown)}")
    if not int_in(1, 65536)(v.get("rank")):
        errors.append(f"{where}: lora.rank: expected an integer 1..65536, got {v.get('rank')!r}")
    if "alpha" in v and not (is_num(v["alpha"]) and 0 < v["alpha"] <= 1e6):
        errors.append(f"{where}: lora.alpha: expected a number in (0, 1e6], got {v['alpha']!r}")
    if "dropout" in v and not (is_num(v["dropout"]) and 0 <= v["dropout"] < 1):
        errors.append(f"{where}: lora.dropout: expected a probability in [0, 1), got {v['dropout']!r}")
    t = v.get("targets")
    if t == "all-linear":
        return
    if not (isinstance(t, list) and t and all(x in TARGETS for x in t) and len(set(t)) == len(t)):
        errors.append(f"{where}: lora.targets: expected a non-empty list of distinct {TARGETS}, got {t!r}")


def check_dataset(v, errors, where):
    if not isinstance(v, dict):
        errors.append(f"{where}: dataset: expected an object")
        return
    unknown = set(v) - {"rows", "mean_tokens_per_row", "tokens", "max_tokens_per_row"}
    if unknown:
        errors.append(f"{where}: dataset: unknown keys {sorted(unknown)}")
    for k in ("rows", "tokens"):
        if k in v and not int_in(1, 2 ** 50)(v[k]):
            errors.append(f"{where}: dataset.{k}: expected a positive integer, got {v[k]!r}")
    for k in ("mean_tokens_per_row", "max_tokens_per_row"):
        if k in v and not int_in(1, MAX_TOKENS)(v[k]):
            errors.append(f"{where}: dataset.{k}: expected an integer 1..2^24, got {v[k]!r}")
    if "rows" not in v and "tokens" not in v:
        errors.append(f"{where}: dataset: give rows or tokens (the job reader requires one of them)")
    if is_int(v.get("mean_tokens_per_row")) and is_int(v.get("max_tokens_per_row")) and \
            v["mean_tokens_per_row"] > v["max_tokens_per_row"]:
        errors.append(f"{where}: dataset.mean_tokens_per_row above max_tokens_per_row")


def check_quantization(v, errors, where):
    if not (isinstance(v, dict) and set(v) == {"double_quant"} and is_bool(v["double_quant"])):
        errors.append(f"{where}: quantization: expected {{\"double_quant\": bool}}, got {v!r}")


_PARALLEL_KV = r"(?:(?:tp|pp|cp|dp_shard|dp_replicate)=\d+|shard=(?:zero1|zero2|zero3|fsdp|fsdp_shard_grad_op)|offload=(?:none|optimizer|optimizer\+params))"
PARALLEL_RE = re.compile(r"^" + _PARALLEL_KV + r"(?:," + _PARALLEL_KV + r")*$")


def model_parallel(layout):
    """True when a --parallel layout has a tensor, pipeline or context degree above 1."""
    return any(k in ("tp", "pp", "cp") and int(v) > 1 for k, v in (kv.split("=") for kv in layout.split(",")))

# job key -> validator (returns bool) or a function(v, errors, where)
JOB_KEYS = {
    "model": lambda v: isinstance(v, str) and v != "",
    "gpu": lambda v: isinstance(v, str) and v != "",
    "gpus": int_in(1, 1048576),
    "method": one_of("full", "lora", "qlora"),
    "lora": check_lora,
    "precision": one_of("mixed", "mixed-fp32-grads", "bf16", "fp32", "amp"),
    "optimizer": one_of("adamw", "adamw8bit", "sgd"),
    "paged_optimizer": is_bool,
    "seq_len": int_in(1, MAX_TOKENS),
    "micro_batch": int_in(1, 1048576),
    "grad_accum": int_in(1, 1048576),
    "checkpointing": one_of("none", "full", "selective"),
    "attention": one_of("fused", "eager"),
    "strategy": lambda v: v in STRATEGIES,
    "dataset": check_dataset,
    "framework": lambda v: v in FRAMEWORKS,
    "fsdp_version": lambda v: v in (1, 2) and not is_bool(v),
    "loss": one_of("full", "chunked", "fused-linear"),
    "compile": is_bool,
    "packing": is_bool,
    "activation_offload": is_bool,
    "optimizer_in_backward": is_bool,
    "quantization": check_quantization,
    "parallel": lambda v: isinstance(v, str) and bool(PARALLEL_RE.match(v)),
    # the slot the GPUs sit in, GENxLANES (planner/hardware_spec.h parse_pcie_slot)
    "pcie_slot": lambda v: isinstance(v, str) and bool(re.match(r"^(?:gen)?[1-6]x(?:1|2|4|8|16)$", v)),
    # how checkpoints save an FSDP model (planner/training_setup.h StateDict)
    "state_dict": one_of("full", "sharded", "local"),
}


def check_job(job, case, errors):
    where = f"case {case.get('id')}: job"
    if not isinstance(job, dict):
        errors.append(f"{where}: expected an object")
        return
    for k, v in job.items():
        if k not in JOB_KEYS:
            errors.append(f"{where}: unknown key '{k}'")
            continue
        check = JOB_KEYS[k]
        if check in (check_lora, check_dataset, check_quantization):
            check(v, errors, where)
        elif not check(v):
            errors.append(f"{where}: {k}: invalid value {v!r}")
    for k in ("model", "gpu", "gpus"):
        if k not in job:
            errors.append(f"{where}: '{k}' missing")
    expressible = case.get("expressible") is True
    method = job.get("method")
    if expressible:
        for k in ("method", "precision", "optimizer", "seq_len", "micro_batch", "checkpointing", "framework"):
            if k not in job:
                errors.append(f"{where}: '{k}' missing (expressible case)")
        if "strategy" not in job and "parallel" not in job:
            errors.append(f"{where}: 'strategy' (or a data-parallel 'parallel' layout) missing (expressible case)")
        if isinstance(job.get("parallel"), str) and PARALLEL_RE.match(job["parallel"]) and model_parallel(job["parallel"]):
            errors.append(f"{where}: 'parallel' with TP/PP/CP set on an expressible case")
    if "strategy" in job and "parallel" in job:
        errors.append(f"{where}: both 'strategy' and 'parallel'")
    if job.get("strategy") == "single" and job.get("gpus") != 1:
        errors.append(f"{where}: strategy single with gpus {job.get('gpus')}")
    if job.get("gpus", 1) > 1 and job.get("strategy") == "single":
        errors.append(f"{where}: several GPUs with strategy single")
    if job.get("gpus") == 1 and job.get("strategy") not in (None, "single", "zero3_offload", "zero2_offload"):
        errors.append(f"{where}: one GPU with strategy {job.get('strategy')}")
    if method in ("lora", "qlora") and "lora" not in job and expressible:
        errors.append(f"{where}: method {method} without a lora object")
    if method == "full" and "lora" in job:
        errors.append(f"{where}: method full with a lora object")
    if method == "qlora" and "quantization" not in job:
        errors.append(f"{where}: method qlora without quantization")
    if "quantization" in job and method != "qlora":
        errors.append(f"{where}: quantization without method qlora")
    strategy = job.get("strategy")
    if (strategy in FSDP_STRATEGIES or "shard=fsdp" in str(job.get("parallel", ""))) and "fsdp_version" not in job:
        errors.append(f"{where}: strategy {strategy} without fsdp_version")
    if strategy in DEEPSPEED_STRATEGIES and "fsdp_version" in job:
        errors.append(f"{where}: fsdp_version with the DeepSpeed strategy {strategy}")
    if job.get("paged_optimizer") and job.get("optimizer") == "sgd":
        errors.append(f"{where}: paged_optimizer with sgd")
    ds = job.get("dataset") or {}
    if "max_tokens_per_row" in ds and is_int(job.get("seq_len")) and ds["max_tokens_per_row"] > job["seq_len"]:
        errors.append(f"{where}: dataset.max_tokens_per_row {ds['max_tokens_per_row']} > seq_len {job['seq_len']}")
    if job.get("activation_offload") and job.get("checkpointing") == "none":
        errors.append(f"{where}: activation_offload without checkpointing")


def model_exists(name):
    if "/" in name or name.endswith(".json"):
        return os.path.isfile(name if os.path.isabs(name) else os.path.join(ROOT, name))
    return os.path.isfile(os.path.join(ROOT, "configs", "models", name + ".json"))


def gpu_exists(name):
    if "/" in name or name.endswith(".json"):
        return os.path.isfile(name if os.path.isabs(name) else os.path.join(ROOT, name))
    return os.path.isfile(os.path.join(ROOT, "hwdb", name + ".json"))


NUMBER_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


def published_bytes(published, unit):
    """The byte count a published figure converts to (the larger end of a range such as '72-80 GB')."""
    numbers = [Decimal(x.replace(",", "")) for x in NUMBER_RE.findall(published)]
    if not numbers:
        return None
    return int((max(numbers) * UNITS[unit]).to_integral_value(rounding=ROUND_HALF_EVEN))


def check_measured(m, case, sources, errors):
    where = f"case {case.get('id')}: measured"
    if not isinstance(m, dict):
        errors.append(f"{where}: expected an object")
        return
    if list(m) != MEASURED_KEYS and set(m) != set(MEASURED_KEYS):
        errors.append(f"{where}: keys {sorted(m)} differ from {MEASURED_KEYS}")
    peak = m.get("peak_memory_bytes")
    oom = m.get("oom")
    if not is_bool(oom):
        errors.append(f"{where}: oom: expected a bool")
    if m.get("metric") not in METRICS:
        errors.append(f"{where}: metric {m.get('metric')!r} not in {sorted(METRICS)}")
    if not isinstance(m.get("published"), str) or not m.get("published"):
        errors.append(f"{where}: published: expected the figure as printed")
    if peak is not None and not (is_int(peak) and peak > 0):
        errors.append(f"{where}: peak_memory_bytes: expected a positive integer or null")
    if oom and peak is not None:
        errors.append(f"{where}: an OOM case with a peak")
    if oom and m.get("published") != "OOM":
        errors.append(f"{where}: an OOM case should publish 'OOM'")
    if not oom and peak is None and not str(m.get("published", "")).startswith("fits"):
        errors.append(f"{where}: no peak and not OOM: published should say 'fits ...'")
    for k in ("tokens_per_s_per_gpu", "step_time_s"):
        v = m.get(k)
        if v is not None and not (is_num(v) and v > 0):
            errors.append(f"{where}: {k}: expected a positive number or null")
    if oom and m.get("tokens_per_s_per_gpu") is not None:
        errors.append(f"{where}: an OOM case with a throughput")
    src = sources.get(case.get("source"))
    if peak is not None and src and src.get("unit") in UNITS:
        expect = published_bytes(m.get("published", ""), src["unit"])
        if expect != peak:
            errors.append(f"{where}: peak_memory_bytes {peak} != published {m.get('published')!r} in "
                          f"{src['unit']} ({expect})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite", nargs="?", default=os.path.join(ROOT, "configs", "validation", "published.json"))
    ap.add_argument("--ftplan", help="ftplan binary: also run `ftplan memory` on each expressible job")
    ap.add_argument("--data-dir", help="with --ftplan: FTPLAN_DATA_DIR for the binary (default: this checkout; "
                    "it must hold the configs/frameworks/ profiles the binary reads)")
    ap.add_argument("--all-keys", action="store_true",
                    help="with --ftplan: pass the jobs whole (for a binary that reads the framework-profile keys)")
    args = ap.parse_args()

    errors, warnings = [], []
    try:
        with open(args.suite) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"check_suite: {args.suite}: {e}")
        return 1

    if not isinstance(doc, dict):
        print("check_suite: the suite is not a JSON object")
        return 1
    if set(doc) != TOP_KEYS:
        errors.append(f"top level: keys {sorted(doc)} differ from {sorted(TOP_KEYS)}")
    if doc.get("format") != "ftplan-validation/1":
        errors.append(f"format: {doc.get('format')!r} is not 'ftplan-validation/1'")
    th = doc.get("thresholds", {})
    if set(th) != THRESHOLD_KEYS:
        errors.append(f"thresholds: keys {sorted(th)} differ from {sorted(THRESHOLD_KEYS)}")
    min_cases = th.get("min_cases_per_source", 3)

    sources = doc.get("sources", {})
    for key, s in sources.items():
        where = f"source {key}"
        if list(s) != SOURCE_KEYS and set(s) != set(SOURCE_KEYS):
            errors.append(f"{where}: keys {sorted(s)} differ from {SOURCE_KEYS}")
        for k in SOURCE_KEYS:
            if not isinstance(s.get(k), str) or not s.get(k):
                errors.append(f"{where}: {k}: expected a non-empty string")
        if s.get("metric") not in METRICS:
            errors.append(f"{where}: metric {s.get('metric')!r} not in {sorted(METRICS)}")
        if s.get("unit") not in UNITS:
            errors.append(f"{where}: unit {s.get('unit')!r} not in {sorted(UNITS)}")
        url = s.get("url", "")
        if "github.com" in url and not re.search(r"/(?:blob|tree)/[0-9a-f]{40}/", url):
            errors.append(f"{where}: url is not pinned to a 40-hex commit: {url}")

    cases = doc.get("cases", [])
    by_id = {}
    for c in cases:
        cid = c.get("id")
        if cid in by_id:
            errors.append(f"case {cid}: duplicate id")
        by_id[cid] = c

    for c in cases:
        cid = c.get("id")
        where = f"case {cid}"
        for k in CASE_REQUIRED:
            if k not in c:
                errors.append(f"{where}: '{k}' missing")
        unknown = set(c) - set(CASE_REQUIRED) - set(CASE_OPTIONAL)
        if unknown:
            errors.append(f"{where}: unknown keys {sorted(unknown)}")
        if c.get("source") not in sources:
            errors.append(f"{where}: source {c.get('source')!r} not in sources")
        url = c.get("url", "")
        if not url.startswith("https://"):
            errors.append(f"{where}: url is not an https URL")
        if "github.com" in url and not re.search(r"/blob/[0-9a-f]{40}/.+#L\d+", url):
            errors.append(f"{where}: url is not pinned to a commit with a #L line anchor: {url}")
        if not isinstance(c.get("quote"), str) or not c.get("quote"):
            errors.append(f"{where}: quote: expected a non-empty string")
        if not isinstance(c.get("notes"), str) or not c.get("notes"):
            errors.append(f"{where}: notes: expected a non-empty string")
        if not is_bool(c.get("expressible")):
            errors.append(f"{where}: expressible: expected a bool")
        if c.get("expressible") is False and not c.get("not_expressible_because"):
            errors.append(f"{where}: not expressible without not_expressible_because")
        if c.get("expressible") is True and "not_expressible_because" in c:
            errors.append(f"{where}: expressible with not_expressible_because")
        if "exclude" in c and c["exclude"] is not True:
            errors.append(f"{where}: exclude, when present, must be true")
        if c.get("exclude") and not c.get("exclude_because"):
            errors.append(f"{where}: exclude without exclude_because")
        if "exclude_because" in c and not c.get("exclude"):
            errors.append(f"{where}: exclude_because without exclude")
        check_job(c.get("job"), c, errors)
        check_measured(c.get("measured"), c, sources, errors)
        job = c.get("job") or {}
        if c.get("expressible") is True:
            if isinstance(job.get("model"), str) and not model_exists(job["model"]):
                errors.append(f"{where}: model {job['model']!r} has no config in configs/models")
            if isinstance(job.get("gpu"), str) and not gpu_exists(job["gpu"]):
                errors.append(f"{where}: gpu {job['gpu']!r} has no hwdb file")
        else:
            if isinstance(job.get("gpu"), str) and not gpu_exists(job["gpu"]):
                warnings.append(f"{where}: (not expressible) gpu {job['gpu']!r} has no hwdb file")
        # OOM boundary
        ob = c.get("oom_boundary")
        m = c.get("measured") or {}
        if ob is not None:
            if not (isinstance(ob, dict) and set(ob) == {"pair", "side"}):
                errors.append(f"{where}: oom_boundary: expected {{pair, side}}")
                continue
            if ob["side"] not in ("fits", "oom"):
                errors.append(f"{where}: oom_boundary.side {ob['side']!r} is not fits or oom")
            if (ob["side"] == "oom") != bool(m.get("oom")):
                errors.append(f"{where}: oom_boundary.side {ob['side']} but measured.oom {m.get('oom')}")
            pair = ob["pair"]
            if pair is None:
                if ob["side"] != "oom":
                    errors.append(f"{where}: a boundary without a pair must be a published OOM")
            elif pair not in by_id:
                errors.append(f"{where}: oom_boundary.pair {pair!r} is not a case")
            else:
                other = by_id[pair].get("oom_boundary") or {}
                if other.get("pair") != cid:
                    errors.append(f"{where}: oom pair {pair} does not point back (it points to {other.get('pair')!r})")
                elif other.get("side") == ob["side"]:
                    errors.append(f"{where}: oom pair {pair} is on the same side ({ob['side']})")
        elif m.get("oom"):
            errors.append(f"{where}: a published OOM without oom_boundary")

    # Optional: run ftplan on each expressible job (reduced to the keys of today's reader unless --all-keys).
    ftplan_failures = 0
    adjusted_gpus = set()
    if args.ftplan:
        known = {"model", "gpu", "gpus", "method", "lora", "precision", "optimizer", "paged_optimizer", "seq_len",
                 "micro_batch", "grad_accum", "checkpointing", "attention", "strategy", "parallel"}
        with tempfile.TemporaryDirectory() as tmp:
            for c in cases:
                if c.get("expressible") is not True:
                    continue
                if args.all_keys:
                    job = json.loads(json.dumps(c["job"]))
                else:
                    job = {k: v for k, v in c["job"].items() if k in known}
                    if job.get("precision") == "amp":
                        job["precision"] = "mixed-fp32-grads"
                    if job.get("checkpointing") == "selective":
                        job["checkpointing"] = "full"
                    ds = {k: v for k, v in (c["job"].get("dataset") or {}).items()
                          if k in ("rows", "mean_tokens_per_row", "tokens")}
                    if ds:
                        job["dataset"] = ds
                job["model"] = os.path.join(ROOT, "configs", "models", job["model"] + ".json")
                job["gpu"] = os.path.join(ROOT, "hwdb", job["gpu"] + ".json")
                path = os.path.join(tmp, c["id"] + ".json")
                env = dict(os.environ, FTPLAN_DATA_DIR=args.data_dir or ROOT)

                def run():
                    with open(path, "w") as f:
                        json.dump(job, f)
                    return subprocess.run([args.ftplan, "memory", path, "--json"], capture_output=True, text=True,
                                          env=env)

                r = run()
                # hwdb files gain host_memory_bytes_per_node with the framework-profile change; when the binary
                # and the hwdb file disagree about it, retry with a copy of the GPU file adjusted to the binary.
                for problem in ("host_memory_bytes_per_node: unknown key", "host_memory_bytes_per_node: missing"):
                    if r.returncode != 0 and problem in r.stderr:
                        with open(job["gpu"]) as f:
                            hw = json.load(f)
                        if problem.endswith("unknown key"):
                            hw.pop("host_memory_bytes_per_node", None)
                            hw.get("sources", {}).pop("host_memory_bytes_per_node", None)
                        else:
                            hw["host_memory_bytes_per_node"] = 1 << 40
                            hw.setdefault("sources", {})["host_memory_bytes_per_node"] = "placeholder (check_suite)"
                        adjusted_gpus.add(c["job"]["gpu"])
                        job["gpu"] = os.path.join(tmp, os.path.basename(job["gpu"]))
                        with open(job["gpu"], "w") as f:
                            json.dump(hw, f)
                        r = run()
                if r.returncode != 0:
                    ftplan_failures += 1
                    errors.append(f"case {c['id']}: ftplan memory exit {r.returncode}: {r.stderr.strip()[:300]}")

    # Totals
    per_source = defaultdict(Counter)
    for c in cases:
        s = per_source[c.get("source")]
        s["cases"] += 1
        if c.get("expressible") is True:
            s["expressible"] += 1
            if not c.get("exclude"):
                s["scored"] += 1
        if c.get("exclude"):
            s["excluded"] += 1
        if (c.get("measured") or {}).get("peak_memory_bytes") is not None:
            s["memory"] += 1
        if (c.get("measured") or {}).get("tokens_per_s_per_gpu") is not None:
            s["throughput"] += 1
        if c.get("oom_boundary") is not None:
            s["oom_boundary"] += 1
    for key in sources:
        if key not in per_source:
            warnings.append(f"source {key}: no cases")
        elif per_source[key]["scored"] < min_cases:
            warnings.append(f"source {key}: {per_source[key]['scored']} scored cases (< min_cases_per_source {min_cases})")

    def count(pred):
        return sum(1 for c in cases if pred(c))

    expressible = lambda c: c.get("expressible") is True
    scored = lambda c: expressible(c) and not c.get("exclude")
    boundary = lambda c: c.get("oom_boundary") is not None
    paired = lambda c: boundary(c) and c["oom_boundary"].get("pair") is not None
    multi = lambda c: (c.get("job") or {}).get("gpus", 1) > 1
    tput = lambda c: (c.get("measured") or {}).get("tokens_per_s_per_gpu") is not None
    memory = lambda c: (c.get("measured") or {}).get("peak_memory_bytes") is not None

    print(f"suite: {os.path.relpath(args.suite, os.getcwd())}")
    print(f"cases: {len(cases)}  expressible: {count(expressible)}  excluded: {count(lambda c: c.get('exclude'))}  "
          f"scored (expressible, not excluded): {count(scored)}")
    print(f"with a memory figure: {count(memory)} ({count(lambda c: memory(c) and scored(c))} scored)  "
          f"with throughput: {count(tput)} ({count(lambda c: tput(c) and scored(c))} scored)")
    print(f"multi-GPU: {count(multi)} ({count(lambda c: multi(c) and scored(c))} scored)")
    print(f"OOM boundary: {count(boundary)} cases ({count(paired) // 2} pairs, "
          f"{count(lambda c: boundary(c) and not paired(c))} unpaired published OOMs); "
          f"{count(lambda c: boundary(c) and scored(c))} scored")
    print(f"published OOMs: {count(lambda c: (c.get('measured') or {}).get('oom'))}")
    print()
    print(f"{'source':36} {'cases':>5} {'expr':>5} {'excl':>5} {'scored':>6} {'memory':>6} {'tput':>5} {'oom':>4}  metric/unit")
    for key in list(sources) + sorted(set(per_source) - set(sources), key=str):
        s = per_source.get(key, Counter())
        src = sources.get(key, {})
        print(f"{str(key):36} {s['cases']:5} {s['expressible']:5} {s['excluded']:5} {s['scored']:6} {s['memory']:6} "
              f"{s['throughput']:5} {s['oom_boundary']:4}  {src.get('metric')}/{src.get('unit')}")
    reasons = Counter(c.get("not_expressible_because") for c in cases if c.get("expressible") is False)
    print()
    print("not expressible:")
    for r, n in reasons.most_common():
        print(f"  {n:3}  {r}")
    if args.ftplan:
        print()
        print(f"ftplan memory on {count(expressible)} expressible jobs"
              f"{' (whole jobs)' if args.all_keys else ' (reduced to the keys of the HEAD reader)'}: "
              f"{ftplan_failures} failed")
        if adjusted_gpus:
            print(f"  (host_memory_bytes_per_node adjusted to this binary's reader for {sorted(adjusted_gpus)})")
    for w in warnings:
        print(f"warning: {w}")
    if errors:
        print()
        for e in errors:
            print(f"error: {e}")
        print(f"{len(errors)} error(s)")
        return 1
    print()
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
