#!/usr/bin/env python3
"""Summarise bench/run.sh results as one markdown table.

Usage: report.py RESULTS_DIR   (files named <server>-<workload>-r<round>.json)

Each figure is the median over the rounds that produced a result.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ALL_SERVERS = ["strata", "strata-base", "qemu-nbd", "nbdkit", "raw"]
PEERS = ["qemu-nbd", "nbdkit"]
WORKLOADS = ["randread-4k", "randwrite-4k", "seqread-1m", "seqwrite-1m"]


def load(res: Path, server: str, workload: str):
    rounds = [r for p in sorted(res.glob(f"{server}-{workload}-r*.json"))
              if (r := load_one(p, workload)) is not None]
    if not rounds:
        return None
    median = {}
    for key in ("iops", "mibs", "p99_us"):
        values = [r[key] for r in rounds if r[key] is not None]
        median[key] = statistics.median(values) if values else None
    median["rounds"] = len(rounds)
    return median


def load_one(p: Path, workload: str):
    text = p.read_text()
    try:
        doc = json.loads(text[text.index("{"):])
    except ValueError:
        return None
    job = doc["jobs"][0]
    if job.get("error"):
        return None
    d = job["write"] if "write" in workload else job["read"]
    pct = d.get("clat_ns", {}).get("percentile", {}) or d.get("lat_ns", {}).get("percentile", {})
    p99 = pct.get("99.000000")
    return {
        "iops": d["iops"],
        "mibs": d["bw_bytes"] / (1024 * 1024),
        "p99_us": p99 / 1000 if p99 is not None else None,
    }


def fmt(v, nd=0):
    if v is None:
        return "n/a"
    return f"{v:,.{nd}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}"


def main() -> int:
    res = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "out" / "results"
    # strata-base (an older binary run in the same rounds) appears only when it was run.
    servers = [s for s in ALL_SERVERS if s != "strata-base" or any(res.glob("strata-base-*.json"))]
    engine = (res / "raw-engine.txt").read_text().strip() if (res / "raw-engine.txt").exists() else "raw"
    header = ["workload"]
    for s in servers:
        label = f"raw ({engine})" if s == "raw" else s
        header += [f"{label} IOPS", f"{label} MiB/s", f"{label} p99 µs"]
    header += ["strata / best peer", "strata / raw"]
    if "strata-base" in servers:
        header.append("strata / strata-base")
    rows = []
    for w in WORKLOADS:
        r = {s: load(res, s, w) for s in servers}
        row = [w]
        for s in servers:
            x = r[s]
            row += [fmt(x and x["iops"]), fmt(x and x["mibs"], 1), fmt(x and x["p99_us"])]
        key = "iops"
        peers = [r[p][key] for p in PEERS if r[p]]
        best = max(peers) if peers else None
        row.append(ratio(r["strata"] and r["strata"][key], best))
        if w.startswith("seq"):
            row.append(ratio(r["strata"] and r["strata"]["mibs"], r["raw"] and r["raw"]["mibs"]))
        else:
            row.append("")
        if "strata-base" in servers:
            row.append(ratio(r["strata"] and r["strata"][key], r["strata-base"] and r["strata-base"][key]))
        rows.append(row)
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    counts = sorted({r["rounds"] for w in WORKLOADS for s in servers if (r := load(res, s, w))})
    print(f"Medians over {', '.join(map(str, counts))} round(s) per cell.")
    print("Ratios: 'strata / best peer' compares IOPS with the better of qemu-nbd and nbdkit;")
    print("'strata / raw' compares MiB/s with fio on the file itself (1 MiB sequential only).")
    if "strata-base" in servers:
        print("'strata / strata-base' compares IOPS with the baseline binary, measured in the same rounds.")
    for server in [s for s in servers if s.startswith("strata")]:
        for name, label in [("idle", "idle, one export, before any I/O"),
                            ("loaded", "idle, 5 s after the last job")]:
            p = res / f"{server}-{name}-rss-kib.txt"
            if p.exists() and p.read_text().strip():
                kib = int(p.read_text().split()[0])
                print(f"{server} VmRSS ({label}): {kib / 1024:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
