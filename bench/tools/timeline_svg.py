#!/usr/bin/env python3
"""Draws one step of a Strata trace (strata bench step --trace FILE) as an SVG.

usage: timeline_svg.py TRACE.json STEP OUT.svg [TITLE]

One row per resource: the compute stream's fwd/bwd spans, cpuadam, the rank's
shard waits, cpuadam's optimizer-state waits, and the NVMe reads, NVMe writes
and host->device copies (every lane of a link on one row: the union of its
moves). The window is the step's, from the end of the step before, as
timeline.Overlap counts it. Each row's label gives its busy time (the union of
its spans) over the window. Python's standard library only.
"""
import json
import sys
from xml.sax.saxutils import escape

trace, stepn, out = sys.argv[1], sys.argv[2], sys.argv[3]
title = sys.argv[4] if len(sys.argv) > 4 else "step " + stepn
ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
steps = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev if e.get("cat") == "step")
w0 = w1 = None
prev = None
for a, b, n in steps:
    if n == "step " + stepn:
        w0, w1 = (prev if prev is not None else a), b
    prev = b
if w0 is None:
    sys.exit("no step %s in %s" % (stepn, trace))


def row_of(e):
    c, a = e.get("cat"), e.get("args", {})
    if c == "compute":
        return "compute stream", "#4c72b0" if e["name"].startswith("fwd") else "#55a868"
    if c == "adam":
        return "cpu adam", "#c44e52"
    if c == "stall":
        return "shard waits (rank)", "#8172b2"
    if c == "optwait":
        return "optimizer-state waits (cpuadam)", "#ccb974"
    if c == "move":
        link = (a.get("from"), a.get("to"))
        if link == ("nvme", "host"):
            return "nvme reads", "#64b5cd"
        if link == ("host", "nvme"):
            return "nvme writes", "#dd8452"
        if link == ("host", "hbm"):
            return "host->device", "#937860"
    return None, None


rows = ["compute stream", "cpu adam", "shard waits (rank)", "optimizer-state waits (cpuadam)", "nvme reads", "nvme writes", "host->device"]
spans = {r: [] for r in rows}
for e in ev:
    r, color = row_of(e)
    if r is None:
        continue
    a, b = max(e["ts"], w0), min(e["ts"] + e["dur"], w1)
    if b > a:
        spans[r].append((a, b, color))


def union(sp):
    tot, cur = 0.0, None
    for a, b, _ in sorted(sp):
        if cur is None or a > cur[1]:
            if cur:
                tot += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur:
        tot += cur[1] - cur[0]
    return tot


W, left, rowh, top = 1200, 300, 26, 40
span_us = w1 - w0
x = lambda t: left + (t - w0) / span_us * (W - left - 20)
h = top + rowh * len(rows) + 40
svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, h),
       '<rect width="100%" height="100%" fill="white"/>',
       '<text x="10" y="20" font-size="14">%s: %.1f s</text>' % (escape(title), span_us / 1e6)]
for i, r in enumerate(rows):
    y = top + i * rowh
    busy = union(spans[r]) / 1e6
    svg.append('<text x="10" y="%d">%s: %.1f s (%.0f%%)</text>' % (y + 16, escape(r), busy, 100 * busy * 1e6 / span_us))
    svg.append('<rect x="%d" y="%d" width="%d" height="%d" fill="#f4f4f4"/>' % (left, y + 3, W - left - 20, rowh - 6))
    for a, b, color in spans[r]:
        svg.append('<rect x="%.1f" y="%d" width="%.2f" height="%d" fill="%s" fill-opacity="0.8"/>' % (x(a), y + 3, max(x(b) - x(a), 0.5), rowh - 6, color))
ty = top + rowh * len(rows) + 15
for k in range(11):
    t = w0 + span_us * k / 10
    svg.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999"/>' % (x(t), top, x(t), ty - 10))
    svg.append('<text x="%.1f" y="%d" text-anchor="middle">%.0f s</text>' % (x(t), ty + 5, (t - w0) / 1e6))
svg.append('<text x="%d" y="%d" fill="#4c72b0">fwd</text><text x="%d" y="%d" fill="#55a868">bwd</text>' % (left, h - 5, left + 40, h - 5))
svg.append("</svg>")
open(out, "w").write("\n".join(svg))
