#!/usr/bin/env python3
"""Summarise `omni-pipe parity --picks FILE` records: per run, the picks, the
misses, and the size of the margin shifts (rms, quantiles of |shift|, the
largest), in bf16 ulps of the run's logit of the reference's pick.

usage: scripts/picks_stats.py PICKS.jsonl [...]
"""
import json
import math
import sys


def quantile(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    i = min(len(v) - 1, max(0, int(math.ceil(q * len(v))) - 1))
    return v[i]


def main(paths):
    for path in paths:
        runs = {}
        with open(path) as f:
            for line in f:
                p = json.loads(line)
                runs.setdefault(p["run"], []).append(p)
        print(path)
        print(f"  {'run':12} {'kind':5} {'picks':>5} {'miss':>4} {'rms':>6} {'p50':>6} {'p90':>6} {'p99':>6} {'max':>6}  largest missed margin")
        for run, ps in runs.items():
            for kind, sel in (("text", lambda p: p["codebook"] < 0), ("codes", lambda p: p["codebook"] >= 0)):
                v = [p for p in ps if sel(p)]
                if not v:
                    continue
                a = [abs(p["shift_ulps"]) for p in v]
                miss = [p for p in v if p["ours"] != p["ref"]]
                rms = math.sqrt(sum(x * x for x in a) / len(a))
                worst = max((p["ref_margin_ulps"] for p in miss), default=0)
                print(f"  {run:12} {kind:5} {len(v):5d} {len(miss):4d} {rms:6.2f} {quantile(a, .5):6.2f} {quantile(a, .9):6.2f} {quantile(a, .99):6.2f} {max(a):6.2f}  {worst:.3g}")


if __name__ == "__main__":
    main(sys.argv[1:])
