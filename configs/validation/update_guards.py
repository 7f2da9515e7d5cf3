#!/usr/bin/env python3
"""Sets the suite's guards to today's accuracy (MAPE + 2 points, wrong OOM calls) from `ftplan validate --json`.

Guards only tighten: a guard that would loosen is left as it is unless --allow-loosen (say why in the
commit). Usage: python3 configs/validation/update_guards.py build/cli/ftplan [--allow-loosen]
"""
import json, math, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "published.json")


def main():
    ftplan = sys.argv[1]
    loosen = "--allow-loosen" in sys.argv
    v = json.loads(subprocess.run([ftplan, "validate", "--json"], capture_output=True, text=True,
                                  env=dict(os.environ, FTPLAN_DATA_DIR=os.path.dirname(os.path.dirname(HERE)))).stdout)
    suite = json.load(open(SUITE))
    guards = suite.setdefault("guards", {"sources": {}})

    def update(old, s, where):
        new = {}
        if s["memory_cases"]: new["memory_mape_pct"] = math.ceil(s["memory_mape_pct"] + 2.0)
        if s["throughput_cases"]: new["throughput_mape_pct"] = math.ceil(s["throughput_mape_pct"] + 2.0)
        if s["oom_boundary_cases"]: new["oom_wrong_max"] = s["oom_boundary_cases"] - s["oom_boundary_right"]
        for k, x in new.items():
            if k in old and x > old[k] and not loosen:
                print(f"{where}: {k} would loosen {old[k]} -> {x}: kept (use --allow-loosen and say why)")
                new[k] = old[k]
            elif old.get(k) != x:
                print(f"{where}: {k} {old.get(k)} -> {x}")
        return new

    guards["overall"] = update(guards.get("overall", {}), v["overall"], "overall")
    for s in v["sources"]:
        guards["sources"][s["source"]] = update(guards["sources"].get(s["source"], {}), s, s["source"])
    open(SUITE, "w").write(json.dumps(suite, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
