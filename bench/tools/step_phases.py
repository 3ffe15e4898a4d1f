#!/usr/bin/env python3
"""Splits each step of a Strata trace (strata bench step --trace FILE) into its
forward and backward, and prints what each resource did in each.

usage: step_phases.py TRACE.json [MIXED_GB_PER_S]

A step's window runs from the end of the step before (as timeline.Overlap and
timeline_svg.py count it); its forward from there to the end of its last
forward compute span, its backward from there to the step's end. Per phase:
its length, the union of the compute stream's spans (a span opens at its
chunk's Acquire, so it holds the waits for that chunk's data: an upper bound of
the compute), cpuadam's busy time, and per link the moves that started in the
phase: their bytes, the link's active time (the union of its moves) and the
bytes over the phase's length. With the drive's mixed rate (the run's probe,
`disk.mixed_bytes_per_s` in bench step's --json, in GB/s) it prints the share
of it each phase's NVMe bytes took. Python's standard library only.
"""
import json
import sys


def union(spans):
    total, cur = 0.0, None
    for a, b in sorted(spans):
        if cur is None or a > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur is not None:
        total += cur[1] - cur[0]
    return total


LINKS = (("nvme", "host", "nvme read"), ("host", "nvme", "nvme write"), ("host", "hbm", "host->device"))


def main():
    trace = sys.argv[1]
    mixed = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev if e.get("cat") == "step")
    moves = [e for e in ev if e.get("cat") == "move"]
    prev = None
    for a, b, name in steps:
        w0 = prev if prev is not None else a
        prev = b
        comp = [e for e in ev if e.get("cat") == "compute" and w0 <= e["ts"] < b]
        fwd = [e for e in comp if e["name"].startswith("fwd")]
        if not fwd:
            continue
        fe = max(e["ts"] + e["dur"] for e in fwd)
        print("%s: %.2f s" % (name, (b - w0) / 1e6))
        for phase, p0, p1 in (("forward", w0, fe), ("backward", fe, b)):
            span = (p1 - p0) / 1e6
            cs = union([(max(e["ts"], p0), min(e["ts"] + e["dur"], p1)) for e in comp if e["ts"] < p1 and e["ts"] + e["dur"] > p0]) / 1e6
            ad = union([(max(e["ts"], p0), min(e["ts"] + e["dur"], p1)) for e in ev
                        if e.get("cat") == "adam" and e["ts"] < p1 and e["ts"] + e["dur"] > p0]) / 1e6
            print("  %-8s %7.2f s  compute spans %6.2f s  cpu adam %6.2f s" % (phase, span, cs, ad))
            nvme = 0
            for frm, to, label in LINKS:
                mv = [e for e in moves if (e["args"].get("from"), e["args"].get("to")) == (frm, to) and p0 <= e["ts"] < p1]
                by = sum(e["args"].get("bytes", 0) for e in mv)
                if frm == "nvme" or to == "nvme":
                    nvme += by
                act = union([(e["ts"], e["ts"] + e["dur"]) for e in mv]) / 1e6
                print("    %-12s %4d moves %7.2f GB  active %6.2f s  %5.2f GB/s over the phase" % (label, len(mv), by / 1e9, act, by / 1e9 / max(span, 1e-9)))
            if mixed > 0:
                need = nvme / 1e9 / mixed
                print("    drive: %.2f GB need %.2f s at %.2f GB/s mixed: %.2f of the phase" % (nvme / 1e9, need, mixed, need / max(span, 1e-9)))


if __name__ == "__main__":
    main()
