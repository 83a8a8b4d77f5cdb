#!/usr/bin/env python3
"""Where a kernel's warps wait, by region, from Nsight Compute's source page.

Reads the CSV of `ncu -i REPORT --page source --csv --print-source sass`
(a report taken with `--set full`, one kernel launch) and prints:
- the warp stall samples of each region: the prologue (what runs before
  the hottest loop), the loop (the instructions executed most often), the
  epilogue (after the loop, run by every warp) and the tail (after the
  loop, run by fewer warps: a last-warp-done step), with their
  instructions executed per warp;
- the stall reasons over the whole kernel;
- the instructions with the most samples and their top reasons.

Usage: hip/bench/stall-regions.py SOURCE.csv [TOP]
"""
import csv
import sys


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and not sys.argv[2].isdigit()):
        sys.exit(__doc__)
    top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    try:
        with open(sys.argv[1], newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        sys.exit(f"{sys.argv[1]}: cannot be read as a CSV ({type(e).__name__}: {e})")
    # line 0 names the kernel, line 1 is the header
    head = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if head is None:
        sys.exit(f"{sys.argv[1]}: no header with Address and Source (not an ncu source page CSV)")
    hdr = rows[head]
    col = {h: i for i, h in enumerate(hdr)}
    need = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    missing = [h for h in need if h not in col]
    if missing:
        sys.exit(f"{sys.argv[1]}: no column {', '.join(missing)} (take the report with --set full)")
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    ins = []
    for r in rows[head + 1:]:
        if len(r) < len(hdr):
            continue
        try:
            addr = int(r[col["Address"]], 16)
        except ValueError:
            continue  # not an instruction line
        ins.append({
            "addr": addr,
            "src": r[col["Source"]].strip(),
            "samples": num(r[col["Warp Stall Sampling (All Samples)"]]),
            "executed": num(r[col["Instructions Executed"]]),
            "stalls": {s[6:]: num(r[col[s]]) for s in stalls},
        })
    if not ins:
        sys.exit(f"{sys.argv[1]}: no instructions")
    ins.sort(key=lambda i: i["addr"])
    hot = max(i["executed"] for i in ins)
    loop = [i["addr"] for i in ins if i["executed"] == hot]
    lo, hi = min(loop), max(loop)
    # the warps: what the first instruction ran
    warps = ins[0]["executed"] or 1

    def region(i):
        if i["addr"] < lo:
            return "prologue"
        if i["addr"] <= hi:
            return "loop"
        return "epilogue" if i["executed"] >= warps else "tail"

    for i in ins:
        i["region"] = region(i)
    names = ["prologue", "loop", "epilogue", "tail"]
    samples = {n: 0.0 for n in names}
    executed = {n: 0.0 for n in names}
    for i in ins:
        samples[i["region"]] += i["samples"]
        executed[i["region"]] += i["executed"]
    total = sum(samples.values()) or 1.0
    print(f"{sys.argv[1]}: {total:.0f} samples, {warps:.0f} warps, the loop {hot / warps:.1f} times a warp")
    for n in names:
        print(f"  {n:9s} {100 * samples[n] / total:5.1f}% of samples, {executed[n] / warps:7.1f} instructions a warp")
    reasons = {}
    for i in ins:
        for k, v in i["stalls"].items():
            reasons[k] = reasons.get(k, 0.0) + v
    rtotal = sum(reasons.values()) or 1.0
    print("stall reasons: " + ", ".join(f"{k} {100 * v / rtotal:.1f}%" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]) if v > 0))
    print(f"top {top_n} instructions by samples:")
    for i in sorted(ins, key=lambda i: -i["samples"])[:top_n]:
        why = sorted(i["stalls"].items(), key=lambda kv: -kv[1])[:2]
        print(f"  {i['addr'] & 0xFFFFF:05x} {i['region']:9s} {i['samples']:5.0f} {' '.join(f'{k}={v:.0f}' for k, v in why if v > 0):28s} {i['src'][:70]}")


if __name__ == "__main__":
    main()
