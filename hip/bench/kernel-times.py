#!/usr/bin/env python3
"""GPU time of one model's token generation by kernel, from a kernel
summary of an Nsight Systems profile (`nsys stats -r cuda_gpu_kern_sum -f
csv`) or from an Nsight Compute CSV (`ncu --csv --metrics
gpu__time_duration.sum`).

usage: kernel-times.py SUMMARY.csv TOKENS

Prints each kernel family's time per token (us) and share, largest first:
a family is the kernel's name and its first template argument (escha's
K, upstream's weight type), so the escha kernels, upstream's quantized
GEMVs and the rest come out as a few lines.
"""
import csv
import re
import sys
from collections import defaultdict


# Microseconds per unit of ncu's time metrics (short and long spellings).
US_PER = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def family(name: str) -> str:
    name = re.sub(r"^void ", "", name.strip())
    m = re.match(r"([\w:]+)(?:<([^,>]*))?", name)
    if not m:
        return name
    return f"{m.group(1)}<{m.group(2)}>" if m.group(2) else m.group(1)


def rows(path: str):
    with open(path, newline="") as f:
        lines = f.readlines()
    # The profilers' own messages and the program's output come first.
    start = next((i for i, l in enumerate(lines) if "Total Time (ns)" in l or "Metric Name" in l), len(lines))
    reader = csv.DictReader(l for l in lines[start:] if l.strip() and not l.startswith("=="))
    for r in reader:
        if "Total Time (ns)" in r:  # nsys cuda_gpu_kern_sum
            yield r["Name"], float(r["Total Time (ns)"]) / 1e3
        elif r.get("Metric Name") == "gpu__time_duration.sum":  # ncu, one row per launch
            v = float(r["Metric Value"].replace(",", ""))
            yield r["Kernel Name"], v * US_PER[r.get("Metric Unit", "ns")]


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    tokens = float(sys.argv[2])
    fam = defaultdict(float)
    try:
        for name, us in rows(sys.argv[1]):
            fam[family(name)] += us
    except (OSError, KeyError, ValueError) as e:
        print(f"{sys.argv[1]}: not a kernel summary this script reads ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    total = sum(fam.values())
    if total == 0:
        print(f"{sys.argv[1]}: no kernel times found", file=sys.stderr)
        return 1
    print(f"{'kernel family':60s} {'us/token':>10s} {'share':>7s}")
    for k, v in sorted(fam.items(), key=lambda kv: -kv[1]):
        print(f"{k[:60]:60s} {v / tokens:10.1f} {100 * v / total:6.1f}%")
    print(f"{'all kernels':60s} {total / tokens:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
