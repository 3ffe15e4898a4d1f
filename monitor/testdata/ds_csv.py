#!/usr/bin/python3
"""DeepSpeed's csv_monitor (deepspeed/monitor/csv_monitor.py, write_events),
restated with the standard library: reads events as JSON lines
{"tag": ..., "value": float.hex, "x": int} from stdin, one JSON array of
them a line (one write_events call each), and writes them into the
directory argv[1] as DeepSpeed does. monitor's TestCSVLikeDeepSpeed compares
its files with the Go writer's byte for byte."""

import csv
import json
import os
import sys

log_dir = sys.argv[1]
os.makedirs(log_dir, exist_ok=True)
filenames = []
for line in sys.stdin:
    for ev in json.loads(line):
        log_name, value, step = ev["tag"], float.fromhex(ev["value"]), ev["x"]
        header = log_name.split("/")[-1] if "/" in log_name else log_name
        filename = log_name.replace("/", "_").replace(" ", "_")
        with open(log_dir + "/" + filename + ".csv", "a+") as f:
            w = csv.writer(f)
            if filename not in filenames:
                filenames.append(filename)
                w.writerow(["step", header])
            w.writerow([step, value])
