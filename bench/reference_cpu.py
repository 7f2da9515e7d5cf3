#!/usr/bin/env python3
"""ftexec beside the independent PyTorch reference (tests/reference/llama_reference.py) on the CPU:
the same model shape, batch, steps and thread count; tokens/s and peak memory of each, and the
ratios ftexec / reference.

  bench/reference_cpu.py                      # 2 threads, Llama-3.2-1B shape scaled down, ~75 s
  bench/reference_cpu.py --threads 1 --steps 6 --seq-len 512 --json out.json

Each run is a child process. Measured the same way for both:
  tokens/s          micro_batch * seq_len / the fastest timed step over --repeats alternated runs
                    (the first --warmup steps of each left out): on a shared machine the fastest
                    step is the one least disturbed by other processes. Both list every step time
                    (ftexec: measured.json `step_times_s`); the medians (what ftexec's own
                    `tokens_per_s` uses) are in --json, and the load average is printed.
  max RSS           getrusage of the child (os.wait4): everything the process touched, the Python
                    interpreter and torch's import included for the reference
  tensor peak       each side's own count of live tensor bytes at the step's peak: ftexec's
                    counting allocator (`ranks[0].peak_memory_bytes`); the reference's weights,
                    gradients and AdamW state plus the peak of PyTorch's profiler memory events over
                    one extra step (profile_memory=True)
Needs build/executor/ftexec (scripts/setup.sh) and python3-torch.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "tests", "reference", "llama_reference.py")

# Llama-3.2-1B (configs/models/llama-3.2-1b.json: head_dim 64, 4 query heads per kv head, MLP 4x
# hidden, tied embeddings, llama3 RoPE) at a size two CPU cores train in seconds per step.
SCALED = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 2,
          "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000}


def torch_python():
    candidates = [os.environ["FTPLAN_PYTHON"]] if os.environ.get("FTPLAN_PYTHON") else [sys.executable, "/usr/bin/python3", "python3"]
    for py in candidates:
        if shutil.which(py) and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
            return py
    sys.exit("bench/reference_cpu.py: no Python with PyTorch (Debian 12: apt-get install python3-torch; "
             "or FTPLAN_PYTHON=/path/to/python)")


def run_child(cmd, log_path):
    """Runs cmd; returns its max RSS in bytes (getrusage of the child)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        with open(log_path) as f:
            sys.exit(f"failed (exit {proc.returncode}): {' '.join(cmd)}\n{f.read()[-3000:]}")
    return usage.ru_maxrss * 1024  # Linux: KiB


def summary(args, step_times_s, max_rss_bytes, tensor_peak_bytes, first_loss):
    return {"step_times_s": step_times_s, "max_rss_bytes": max_rss_bytes, "tensor_peak_bytes": tensor_peak_bytes,
            "first_loss": first_loss}


def combine(args, runs):
    """One side's repeats: every timed step, the largest memory figures."""
    tokens = args.micro_batch * args.seq_len
    times = [t for run in runs for t in run["step_times_s"]]
    return {"tokens_per_s": tokens / min(times), "tokens_per_s_median": tokens / statistics.median(times),
            "step_times_s": times, "max_rss_bytes": max(run["max_rss_bytes"] for run in runs),
            "tensor_peak_bytes": max(run["tensor_peak_bytes"] or 0 for run in runs),
            "first_loss": runs[0]["first_loss"]}


def fmt_times(side):
    return " ".join(f"{t:.2f}" for t in side["step_times_s"])


def run_ftexec(args, config, method, precision, work):
    out = os.path.join(work, f"ftexec-{method}-{precision}.json")
    cmd = [args.ftexec, "run", "--model", config, "--method", method, "--precision", precision,
           "--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch), "--grad-accum", "1",
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
           "--device", "cpu", "--checkpointing", "none", "--attention", "eager", "--lr", "1e-4",
           "--max-grad-norm", "1", "--data", "synthetic", "--seed", "0", "--no-progress", "--out", out]
    if method == "lora":
        cmd += ["--lora-rank", str(args.lora_rank), "--lora-alpha", str(2 * args.lora_rank),
                "--lora-targets", args.lora_targets]
    rss = run_child(cmd, out + ".log")
    with open(out) as f:
        m = json.load(f)
    return summary(args, m["step_times_s"], rss, m["ranks"][0]["peak_memory_bytes"], m["loss"][0])


def run_reference(args, python, config, method, precision, work, tensor_peak):
    out = os.path.join(work, f"reference-{method}-{precision}.json")
    cmd = [python, REFERENCE, "bench", "--config", config, "--method", method, "--precision", precision,
           "--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--threads", str(args.threads), "--lr", "1e-4", "--max-grad-norm", "1",
           "--lora-rank", str(args.lora_rank), "--lora-alpha", str(2 * args.lora_rank),
           "--lora-targets", args.lora_targets, "--out", out]
    if tensor_peak:  # one more, profiled step after the timed ones
        cmd.append("--tensor-peak")
    rss = run_child(cmd, out + ".log")
    with open(out) as f:
        m = json.load(f)
    return summary(args, m["step_times_s"], rss, m["tensor_peak_bytes"], m["loss"][0])


def mib(b):
    return f"{b / 2**20:,.0f} MiB"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2,
                   help="intra-op threads of both (default 2; 1 is steadier on a 2-core machine other jobs share)")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=1, help="steps left out of the timings")
    p.add_argument("--repeats", type=int, default=2, help="runs of each side, alternated")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--lora-rank", type=int, default=16, help="alpha = 2 x rank")
    p.add_argument("--lora-targets", default="q_proj,v_proj", help="PEFT's default for Llama")
    p.add_argument("--methods", default="full,lora")
    p.add_argument("--precisions", default="fp32,bf16", help="bf16: weights, gradients and AdamW state all bf16")
    p.add_argument("--model", default=os.path.join(ROOT, "configs", "models", "llama-3.2-1b.json"),
                   help="config.json to scale down (the SCALED fields are overridden unless --no-scale)")
    p.add_argument("--no-scale", action="store_true", help="use --model as it is")
    p.add_argument("--ftexec", default=os.path.join(ROOT, "build", "executor", "ftexec"))
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    if not os.access(args.ftexec, os.X_OK):
        sys.exit(f"{args.ftexec}: not built (scripts/setup.sh, or cmake --build build)")
    python = torch_python()

    with open(args.model) as f:
        config = json.load(f)
    if not args.no_scale:
        config.update(SCALED)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ftplan_refbench_") as work:
        config_path = os.path.join(work, "config.json")
        with open(config_path, "w") as f:
            json.dump(config, f, indent=1)
        shape = (f"hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, heads "
                 f"{config['num_attention_heads']}/{config['num_key_value_heads']}, MLP {config['intermediate_size']}, "
                 f"vocab {config['vocab_size']}, tied {config.get('tie_word_embeddings', False)}")
        print(f"# ftexec vs reference on the CPU: {shape}; micro-batch {args.micro_batch} x seq {args.seq_len}, "
              f"{args.steps} steps ({args.warmup} warm-up) x {args.repeats} runs, {args.threads} threads, AdamW, LoRA r={args.lora_rank} "
              f"on {args.lora_targets}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        for method in args.methods.split(","):
            for precision in args.precisions.split(","):
                runs = {"ftexec": [], "reference": []}
                for rep in range(args.repeats):  # alternated, so both see the same spells of load
                    runs["ftexec"].append(run_ftexec(args, config_path, method, precision, work))
                    runs["reference"].append(run_reference(args, python, config_path, method, precision, work,
                                                           tensor_peak=rep == 0))
                f, r = combine(args, runs["ftexec"]), combine(args, runs["reference"])
                rows.append({"method": method, "precision": precision, "ftexec": f, "reference": r})
                print(f"#   {method} {precision}: step times (s) ftexec {fmt_times(f)}, reference {fmt_times(r)}",
                      flush=True)
    print()
    print("| method | precision | tokens/s ftexec | tokens/s reference | ratio | max RSS ftexec | max RSS reference "
          "| ratio | tensor peak ftexec | tensor peak reference | ratio | first loss ftexec / reference (own random init) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        f, r = row["ftexec"], row["reference"]
        print(f"| {row['method']} | {row['precision']} | {f['tokens_per_s']:.0f} | {r['tokens_per_s']:.0f} | "
              f"{f['tokens_per_s'] / r['tokens_per_s']:.2f} | {mib(f['max_rss_bytes'])} | {mib(r['max_rss_bytes'])} | "
              f"{f['max_rss_bytes'] / r['max_rss_bytes']:.2f} | {mib(f['tensor_peak_bytes'])} | "
              f"{mib(r['tensor_peak_bytes'])} | {f['tensor_peak_bytes'] / r['tensor_peak_bytes']:.2f} | "
              f"{f['first_loss']:.3f} / {r['first_loss']:.3f} |")
    print(f"\n(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"config": config, "args": vars(args), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
