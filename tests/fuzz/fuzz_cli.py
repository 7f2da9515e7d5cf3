#!/usr/bin/env python3
"""Fuzz test of ftplan and ftexec over mutated job files, model configs, plans, measurements and flags,
and mutated training configs (tests/data/configs: DeepSpeed JSON, accelerate, axolotl, torchtune and
LLaMA-Factory YAML) read with --from, and mutated plans given to ftplan export.

Every run must end with exit code 0, 1 or 2 (never a crash, an internal error or a signal), within
10 s, print no NaN or infinity, and, when it exits 2, say why on exactly one line of standard error.
Runs until --seconds have passed (CI: about 60 s), deterministically from --seed, on --jobs workers.
Before the random runs, every case of the regression corpus (tests/fuzz/corpus/*.json: each one a
past crasher or a bound once broken) runs and must meet its own expectation.

  python3 tests/fuzz/fuzz_cli.py --ftplan build/cli/ftplan --ftexec build/executor/ftexec --seconds 60
  python3 tests/fuzz/fuzz_cli.py ... --save-failures DIR   # writes each failing case as a corpus file

Prints the figures the closing notes quote: runs, by exit code, by command, failures, slowest run.
"""
import argparse
import concurrent.futures
import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUN_LIMIT_S = 10.0

# Values that broke something once, or sit on a bound: numbers as raw JSON text (so that 1e400 and
# 2^64 reach the parser as written), and the strings a user could type.
RAW_VALUES = ["0", "-1", "1", "2", "1.5", "0.9", "0.95", "1e400", "-1e400", "1e308", "1e-300", "1e-400",
              "9223372036854775807", "9223372036854775808", "18446744073709551616", "4294967297",
              "1048576", "1048577", "16777217", "65537", "-0", "0.0", "true", "false", "null", '""',
              '"abc"', '"1e400"', "[]", "{}", '["q_proj"]', '"all-linear"', '"x" ', "3.0e2"]
FLAG_VALUES = ["0", "-1", "1", "2", "3", "8", "64", "1.5", "0.5", "0.9", "0.95", "1e400", "-1e400", "1e-300",
               "nan", "inf", "-inf", "NaN", "1e308", "9223372036854775807", "9223372036854775808",
               "99999999999999999999999", "", "abc", "12abc", "0x10", "1,2", "+3", " 4", "1048577",
               "full", "lora", "qlora", "all-linear", "q_proj,zz", "none", "ddp", "zero3", "pipeline",
               "pipeline_1f1b", "mp", "fsdp_hybrid", "zero3_offload", "h100-sxm", "cpu", "rtx-3090",
               "tiny-test", "llama-3-8b", "/nonexistent.json", "eager", "fused", "bf16", "fp32",
               "mixed-fp32-grads", "adamw8bit", "sgd"]
PLAN_FLAGS = ["--model", "--gpu", "--gpus", "--method", "--lora-rank", "--lora-alpha", "--lora-dropout",
              "--lora-targets", "--precision", "--optimizer", "--seq-len", "--micro-batch", "--grad-accum",
              "--checkpointing", "--attention", "--strategy", "--efficiency", "--epochs", "--headroom",
              "--dataset-rows", "--mean-tokens-per-row", "--dataset-tokens"]
CHECK_FLAGS = ["--max-hours", "--max-cost", "--max-memory-fraction"]
EXEC_FLAGS = ["--method", "--lora-rank", "--lora-alpha", "--lora-dropout", "--lora-targets", "--precision",
              "--seq-len", "--micro-batch", "--grad-accum", "--checkpointing", "--strategy", "--steps", "--lr",
              "--seed", "--warmup", "--threads", "--max-grad-norm", "--weight-decay", "--nproc", "--timeout-s",
              "--bucket-mb", "--zero-bucket-elements", "--cpu-memory-limit-gib"]

NAN_RE = re.compile(r"(?<![A-Za-z])-?(nan|inf|infinity)(?![A-Za-z])", re.IGNORECASE)


def json_paths(value, prefix=()):
    """Every (path, value) of a parsed JSON document."""
    yield prefix, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from json_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from json_paths(v, prefix + (i,))


def set_raw(doc, path, raw):
    """The document as text with the value at `path` replaced by the raw JSON text `raw`."""
    marker = "@@FUZZ@@"
    target = doc
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = marker
    return json.dumps(doc, indent=1).replace('"' + marker + '"', raw)


def mutate_json(rng, text):
    """One random mutation of a JSON document, returned as text (possibly no longer JSON)."""
    kind = rng.random()
    if kind < 0.05:
        return text[: rng.randrange(len(text))]                      # truncated
    if kind < 0.08:
        return text.replace("}", "}}", 1)                             # malformed
    doc = json.loads(text)
    paths = [p for p, _ in json_paths(doc) if p]
    if not paths:
        return text
    path = rng.choice(paths)
    if kind < 0.15:                                                   # a key removed
        target = doc
        for p in path[:-1]:
            target = target[p]
        del target[path[-1]]
        return json.dumps(doc)
    if kind < 0.2 and isinstance(doc, dict):                          # an unknown key
        doc["fuzz_" + str(rng.randrange(100))] = 1
        return json.dumps(doc)
    return set_raw(doc, path, rng.choice(RAW_VALUES))


YAML_VALUES = RAW_VALUES + ["auto", "[1, 2]", "{a: 1}", "'x'", "yes", "~", "2e-5", "1_000", "&a x", "*a", ": :",
                            "- x", "[", "torchtune.models.llama3_1.lora_llama3_1_8b", "meta-llama/Llama-3.1-8B"]
YAML_LINE = re.compile(r"^(\s*)([A-Za-z_][\w.]*):(\s*)(.*)$")


def mutate_yaml(rng, text):
    """One random mutation of a YAML document (a config --from reads), returned as text."""
    kind = rng.random()
    if kind < 0.05:
        return text[: rng.randrange(len(text))]                      # truncated
    lines = text.split("\n")
    keyed = [i for i, line in enumerate(lines) if YAML_LINE.match(line)]
    if not keyed:
        return text
    i = rng.choice(keyed)
    if kind < 0.15:                                                   # a key removed
        del lines[i]
    elif kind < 0.2:                                                  # an unknown key
        lines.append("fuzz_%d: 1" % rng.randrange(100))
    else:
        m = YAML_LINE.match(lines[i])
        lines[i] = "%s%s: %s" % (m.group(1), m.group(2), rng.choice(YAML_VALUES))
    return "\n".join(lines)


def random_flags(rng, names, count):
    args = []
    for name in rng.sample(names, min(count, len(names))):
        args += [name, rng.choice(FLAG_VALUES)]
    return args


class Fuzzer:
    def __init__(self, ftplan, ftexec, workdir, seed):
        self.ftplan, self.ftexec, self.workdir = ftplan, ftexec, workdir
        self.rng = random.Random(seed)
        self.jobs = sorted(glob.glob(os.path.join(ROOT, "configs/jobs/*.json")))
        self.models = sorted(glob.glob(os.path.join(ROOT, "configs/models/*.json")))
        self.counter = 0
        self.plan_text, self.measured_text = self.make_plan_and_measurement()
        # Training configs for --from (tests/data/configs) and a plan to export.
        self.configs = sorted(glob.glob(os.path.join(ROOT, "tests/data/configs/**/*.*"), recursive=True))
        self.configs = [c for c in self.configs if c.endswith((".json", ".yml", ".yaml"))]
        export_plan = os.path.join(workdir, "export-plan.json")
        subprocess.run([ftplan, "plan", "--model", "llama-3.2-1b", "--gpu", "h100-sxm", "--gpus", "4", "--strategy",
                        "zero3", "--micro-batch", "2", "--dataset-rows", "1000", "-o", export_plan], check=True,
                       capture_output=True, timeout=RUN_LIMIT_S)
        self.export_text = open(export_plan).read()

    def file(self, name, text):
        self.counter += 1
        path = os.path.join(self.workdir, "%d-%s" % (self.counter, name))
        with open(path, "w") as f:
            f.write(text)
        return path

    def make_plan_and_measurement(self):
        """A real plan and measurement of the tiny model, to mutate for `ftplan compare` and `ftexec run`."""
        plan = os.path.join(self.workdir, "base-plan.json")
        measured = os.path.join(self.workdir, "base-measured.json")
        subprocess.run([self.ftplan, "plan", "--model", "tiny-test", "--gpu", "cpu", "--seq-len", "32",
                        "--micro-batch", "2", "--attention", "eager", "--precision", "fp32", "--checkpointing",
                        "none", "-o", plan], check=True, capture_output=True, timeout=RUN_LIMIT_S)
        if self.ftexec:
            subprocess.run([self.ftexec, "run", plan, "--steps", "2", "--out", measured, "--no-progress",
                            "--threads", "1"], check=True, capture_output=True, timeout=60)
        else:
            with open(measured, "w") as f:
                f.write('{"format": "ftexec-measured/1", "ranks": []}')
        return open(plan).read(), open(measured).read()

    def random_case(self):
        """One random command line (argv) and a label."""
        rng = self.rng
        r = rng.random()
        if r < 0.35:   # a mutated job file, maybe with flags
            job = self.file("job.json", mutate_json(rng, open(rng.choice(self.jobs)).read()))
            cmd = rng.choice(["memory", "plan", "check", "sweep", "simulate", "report"])
            args = [self.ftplan, cmd, job] + random_flags(rng, PLAN_FLAGS, rng.randrange(0, 3))
            if cmd in ("sweep", "report"):
                args += ["--gpu-types", "a100-80gb-sxm,rtx-3090", "--gpu-counts", rng.choice(["1,2", "4", "8,0", "x"])]
            if cmd == "report":
                args += ["-o", self.file("report.html", "")]
            return cmd + " job-file", args
        if r < 0.55:   # a mutated model config
            model = self.file("config.json", mutate_json(rng, open(rng.choice(self.models)).read()))
            cmd = rng.choice(["memory", "plan", "simulate"])
            return cmd + " model-config", [self.ftplan, cmd, "--model", model, "--seq-len", "256"] + \
                random_flags(rng, PLAN_FLAGS[2:], rng.randrange(0, 3))
        if r < 0.63 and self.configs:   # mutated training configs read with --from, maybe with flags
            cmd = rng.choice(["memory", "plan", "check", "sweep", "simulate"])
            args = [self.ftplan, cmd]
            for _ in range(rng.choice([1, 1, 2])):
                source = rng.choice(self.configs)
                text = open(source).read()
                if source.endswith(".json"):
                    # JSON is YAML too: written as .yml it goes through the YAML reader.
                    name = rng.choice(["ds.json", "ds.yml"])
                    text = mutate_json(rng, text) if rng.random() < 0.8 else text
                else:
                    name = "config.yaml"
                    text = mutate_yaml(rng, text) if rng.random() < 0.8 else text
                args += ["--from", self.file(name, text)]
            args += rng.choice([["--model", "llama-3.2-1b"], ["--gpus", "4"], []])
            args += random_flags(rng, PLAN_FLAGS[1:], rng.randrange(0, 2)) + rng.choice([[], ["--json"]])
            if cmd == "sweep":
                args += ["--gpu-types", "h100-sxm", "--gpu-counts", "1,8"]
            return cmd + " --from", args
        if r < 0.68:   # export a mutated plan to a target
            plan = self.file("plan.json", mutate_json(rng, self.export_text) if rng.random() < 0.8 else self.export_text)
            target = rng.choice(["deepspeed", "accelerate", "axolotl", "torchtune", "llamafactory", "torchrun", "slurm", "x"])
            return "export", [self.ftplan, "export", plan, "--to", target] + rng.choice([[], ["--time-margin", "0.1"],
                                                                                             ["--time-margin", "-1"]])
        if r < 0.78:   # flags only
            cmd = rng.choice(["memory", "plan", "check", "sweep", "simulate"])
            args = [self.ftplan, cmd, "--model", rng.choice(["tiny-test", "llama-3-8b", "qwen2-0.5b"])]
            args += random_flags(rng, PLAN_FLAGS[1:], rng.randrange(1, 5))
            if cmd == "check":
                args += random_flags(rng, CHECK_FLAGS, rng.randrange(0, 3)) + rng.choice([[], ["--json"], ["--any"]])
            if cmd == "sweep":
                args += ["--gpu-types", "h100-sxm", "--gpu-counts", "1,8", "--format",
                         rng.choice(["table", "csv", "json", "markdown", "svg?"])]
            return cmd + " flags", args
        if r < 0.85:   # compare with a mutated plan or measurement
            plan, measured = self.plan_text, self.measured_text
            if rng.random() < 0.5:
                plan = mutate_json(rng, plan)
            else:
                measured = mutate_json(rng, measured)
            return "compare", [self.ftplan, "compare", self.file("plan.json", plan),
                               self.file("measured.json", measured)] + rng.choice([[], ["--json"], ["--force"]])
        if self.ftexec and r < 0.93:   # ftexec with flags that must be refused or run in seconds
            args = [self.ftexec, "run", "--model", "tiny-test", "--device", "cpu", "--steps", "1", "--seq-len",
                    "16", "--micro-batch", "1", "--threads", "1", "--no-progress"]
            flags = random_flags(rng, EXEC_FLAGS, rng.randrange(1, 3))
            # Keep a run that passes validation small: at most 2 steps of at most 64 tokens.
            for i in range(0, len(flags), 2):
                if flags[i] in ("--steps", "--seq-len", "--micro-batch", "--grad-accum", "--nproc") and \
                        re.fullmatch(r"\+?\d+", flags[i + 1].strip() or "x") and int(flags[i + 1]) > 2:
                    flags[i + 1] = "-1" if rng.random() < 0.5 else "0"
            for i in range(0, len(flags), 2):
                if flags[i] in args:
                    j = args.index(flags[i])
                    args[j + 1] = flags[i + 1]
                else:
                    args += flags[i:i + 2]
            return "ftexec flags", args
        if self.ftexec:   # ftexec with a mutated plan file
            plan = self.file("plan.json", mutate_json(rng, self.plan_text))
            # The plan's fields are parsed and checked before these flags shrink the run to seconds.
            return "ftexec plan", [self.ftexec, "run", plan, "--steps", "1", "--threads", "1", "--no-progress",
                                   "--micro-batch", "1", "--seq-len", "16", "--grad-accum", "1",
                                   "--out", self.file("m.json", "")]
        return "plan flags", [self.ftplan, "plan", "--model", "tiny-test"]


def run_one(args):
    t0 = time.monotonic()
    try:
        p = subprocess.run(args, capture_output=True, timeout=RUN_LIMIT_S, text=True, errors="replace",
                           env=dict(os.environ, FTPLAN_DATA_DIR=ROOT))
        return p.returncode, p.stdout, p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            "", time.monotonic() - t0


def problems_of(args, rc, out, err, seconds, allowed_rc=(0, 1, 2)):
    """Why a run broke the contract, or []."""
    found = []
    if rc is None:
        return ["ran over %.0f s" % RUN_LIMIT_S]
    if rc not in allowed_rc:
        found.append("exit code %d (allowed %s)" % (rc, "/".join(map(str, allowed_rc))))
    if re.search(r"internal error|terminate called|Aborted|core dumped|Segmentation", err):
        found.append("crashed: " + err.strip().splitlines()[-1][:200])
    if rc == 2:
        lines = [l for l in err.splitlines() if l.strip()]
        if len(lines) != 1:
            found.append("exit 2 with %d lines on stderr (expected 1)" % len(lines))
    typed = " ".join(args)
    for stream, text in (("stdout", out), ("stderr", err)):
        for m in NAN_RE.finditer(text):
            # An error may quote what the user typed ('nan'); anything else is a computed NaN or inf.
            line = text[text.rfind("\n", 0, m.start()) + 1: text.find("\n", m.end())]
            if rc == 2 and stream == "stderr" and m.group(0).lower() in typed.lower():
                continue
            found.append("%s prints %r: %s" % (stream, m.group(0), line.strip()[:200]))
            break
    if seconds > RUN_LIMIT_S:
        found.append("took %.1f s" % seconds)
    return found


def run_corpus(ftplan, ftexec, workdir):
    """Every regression case: {"why", "argv" (with @FTPLAN@, @FTEXEC@, @DATA@, @TMP@ and @FILE:name@),
    "files": {name: text}, "exit_codes": [allowed]}."""
    failures, count = [], 0
    for path in sorted(glob.glob(os.path.join(HERE, "corpus", "*.json"))):
        case = json.load(open(path))
        if any("@FTEXEC@" in a for a in case["argv"]) and not ftexec:
            continue
        tmp = tempfile.mkdtemp(dir=workdir)
        files = {}
        for name, text in case.get("files", {}).items():
            files[name] = os.path.join(tmp, name)
            with open(files[name], "w") as f:
                f.write(text)
        argv = []
        for a in case["argv"]:
            a = a.replace("@FTPLAN@", ftplan).replace("@FTEXEC@", ftexec or "").replace("@DATA@", ROOT).replace("@TMP@", tmp)
            for name, p in files.items():
                a = a.replace("@FILE:%s@" % name, p)
            argv.append(a)
        rc, out, err, seconds = run_one(argv)
        count += 1
        why = problems_of(argv, rc, out, err, seconds, tuple(case.get("exit_codes", [0, 1, 2])))
        must = case.get("stderr_contains")
        if must and must not in err:
            why.append("stderr does not say %r: %s" % (must, err.strip()[:200]))
        if why:
            failures.append((os.path.basename(path) + " (" + case.get("why", "") + ")", argv, why))
    return count, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ftplan", required=True)
    ap.add_argument("--ftexec", default="")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--save-failures", default="")
    a = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="ftplan-fuzz-")
    t_start = time.monotonic()
    try:
        corpus_runs, failures = run_corpus(a.ftplan, a.ftexec, workdir)
        fz = Fuzzer(a.ftplan, a.ftexec, workdir, a.seed)
        by_rc, by_cmd, slowest, runs = {}, {}, (0.0, []), 0
        deadline = t_start + a.seconds
        with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
            pending = {}
            while time.monotonic() < deadline or pending:
                while time.monotonic() < deadline and len(pending) < 2 * a.jobs:
                    label, argv = fz.random_case()
                    pending[pool.submit(run_one, argv)] = (label, argv)
                done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in done:
                    label, argv = pending.pop(fut)
                    rc, out, err, seconds = fut.result()
                    runs += 1
                    by_rc[rc] = by_rc.get(rc, 0) + 1
                    by_cmd[label] = by_cmd.get(label, 0) + 1
                    if seconds > slowest[0]:
                        slowest = (seconds, argv)
                    why = problems_of(argv, rc, out, err, seconds)
                    if why:
                        failures.append((label, argv, why))
        elapsed = time.monotonic() - t_start
        print("fuzz: %d regression cases, %d random runs in %.1f s (seed %d, %d workers)" %
              (corpus_runs, runs, elapsed, a.seed, a.jobs))
        print("fuzz: exit codes %s" % ", ".join("%s: %d" % (k if k is not None else "timeout", v)
                                                for k, v in sorted(by_rc.items(), key=lambda kv: str(kv[0]))))
        print("fuzz: by kind %s" % ", ".join("%s: %d" % kv for kv in sorted(by_cmd.items())))
        print("fuzz: slowest run %.2f s: %s" % (slowest[0], " ".join(os.path.basename(x) if os.sep in x else x
                                                                      for x in slowest[1])[:300]))
        crashes = sum(1 for _, _, why in failures if any("exit code" in w or "crashed" in w for w in why))
        hangs = sum(1 for _, _, why in failures if any("ran over" in w for w in why))
        print("fuzz: %d failure(s): crashes %d, hangs %d, other %d" %
              (len(failures), crashes, hangs, len(failures) - crashes - hangs))
        for label, argv, why in failures[:20]:
            print("FAIL [%s] %s\n     %s" % (label, " ".join(argv), "; ".join(why)))
        if a.save_failures and failures:
            os.makedirs(a.save_failures, exist_ok=True)
            for i, (label, argv, why) in enumerate(failures):
                files = {}
                for j, x in enumerate(argv):
                    if x.startswith(workdir) and os.path.isfile(x):
                        name = os.path.basename(x)
                        files[name] = open(x).read()
                        argv[j] = "@FILE:%s@" % name
                argv = [x.replace(a.ftplan, "@FTPLAN@").replace(a.ftexec or "@@", "@FTEXEC@") for x in argv]
                with open(os.path.join(a.save_failures, "failure-%03d.json" % i), "w") as f:
                    json.dump({"why": "; ".join(why), "argv": argv, "files": files, "exit_codes": [0, 1, 2]}, f, indent=1)
        return 1 if failures else 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
