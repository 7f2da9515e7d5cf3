#!/usr/bin/env python3
"""Splits each published throughput case's predicted step into its parts, beside the measurement.

For every case with a measured tokens/s (or one --source), writes the case's job to a temporary file,
runs `ftplan plan JOB --json` (the job fixes strategy, micro-batch and checkpointing) and prints
measured | predicted tokens/s per GPU | error, then the step's parts in seconds: compute (forward,
backward, recompute, NF4 dequantisation), exposed communication (of all communication), optimizer step.
Usage: python3 configs/validation/throughput_parts.py build/cli/ftplan [--source S]
"""
import json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ftplan = sys.argv[1]
    source = sys.argv[sys.argv.index("--source") + 1] if "--source" in sys.argv else None
    suite = json.load(open(os.path.join(HERE, "published.json")))
    env = dict(os.environ, FTPLAN_DATA_DIR=os.path.dirname(os.path.dirname(HERE)))
    print(f"{'case':44} {'measured':>8} {'predicted':>9} {'error':>7} | {'step_s':>8} {'compute_s':>9} "
          f"{'exposed_s':>9} {'comm_s':>8} {'optim_s':>8}  tokens/step")
    for c in suite["cases"]:
        measured = c.get("measured", {}).get("tokens_per_s_per_gpu")
        if not c.get("expressible") or c.get("exclude") or not measured or (source and c["source"] != source):
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(c["job"], f)
        out = subprocess.run([ftplan, "plan", f.name, "--json"], capture_output=True, text=True, env=env)
        os.unlink(f.name)
        try:
            cand = json.loads(out.stdout)["candidates"][0]
        except (ValueError, KeyError, IndexError):
            print(f"{c['id']:44} {measured:8.0f}  (no fitting plan to split: see ftplan validate)")
            continue
        pred = cand["tokens_per_s"] / cand["gpus_used"]
        print(f"{c['id']:44} {measured:8.0f} {pred:9.0f} {100 * (pred - measured) / measured:+6.1f}% | "
              f"{cand['step_time_s']:8.3f} {cand['compute_s']:9.3f} {cand['exposed_comm_s']:9.3f} "
              f"{cand['comm_s']:8.3f} {cand['optimizer_s']:8.3f}  {cand['tokens_per_step']:.0f}")


if __name__ == "__main__":
    main()
