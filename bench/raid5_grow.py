#!/usr/bin/python3
"""raid5 grow benchmark (issue 15's real-file targets), side by side in one run.

This machine's disk files share one SSD, so independent disks are emulated as bench/layers.py
does: every old member is a file disk under a `delay` layer limited to BENCH_MEMBER_BW
(default 100MiB per second). The disk `strata raid5 grow --add` adds is a plain file (the verb
takes a path), so the old members are the slowest disks and set the bound. Rows:

- Offline grow 3 -> 4 (no user I/O), ALV and MD-Reshape, each from a freshly filled array:
  time against the bandwidth bound: every old member reads each of its rows once and writes
  each once (the new geometry covers every row), 2 x rows x chunk bytes through a member
  limited to BENCH_MEMBER_BW (target: ALV within 1.15x of the bound).
- 4 KiB random reads and writes (70/30, QD8, BENCH_SECONDS) against the same array with no
  grow, then the same job while an ALV grow runs: p99 completion latency (target: during
  <= 1.5x without), and how far the grow got meanwhile.

Run: bench/raid5_grow.sh (BENCH_DISK_MIB per member, default 512; BENCH_ROUNDS, default 1).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATA = Path(os.environ.get("STRATA_BIN", ROOT / "target/release/strata"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "20"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1"))
MEMBER_BW = os.environ.get("BENCH_MEMBER_BW", "100MiB")
DISK_MIB = int(os.environ.get("BENCH_DISK_MIB", "512"))
# Where the member files live, and whether they bypass the page cache. On this VM O_DIRECT
# files still land in the host's write cache, so every checkpoint's flush pays for the
# window's bytes at the host disk's speed, outside the `delay` members' budget;
# BENCH_DIR=/dev/shm BENCH_DIRECT=0 leaves the `delay` layers as the only limit.
BENCH_DIR = os.environ.get("BENCH_DIR")
DIRECT = os.environ.get("BENCH_DIRECT", "1") == "1"
CHUNK = 64 * 1024
MIB = 1 << 20


def parse_bw(text: str) -> float:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, scale in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


class Server:
    def __init__(self):
        self.work = Path(tempfile.mkdtemp(prefix="strata-grow-bench.", dir=BENCH_DIR))
        lines = ['listen = ["unix:nbd.sock"]', 'admin = "admin.sock"']
        for d in range(3):
            lines += ["[[disk]]", f'name = "d{d}"', f'path = "d{d}.img"', f'size = "{DISK_MIB}MiB"', f"direct = {str(DIRECT).lower()}"]
            lines += ["[[layer]]", f'name = "lim{d}"', 'kind = "delay"', f'children = ["d{d}"]',
                      f'bandwidth = "{MEMBER_BW}"']
        lines += ["[[layer]]", 'name = "r5"', 'kind = "raid5"', 'children = ["lim0", "lim1", "lim2"]',
                  f'chunk = "{CHUNK}"']
        lines += ["[[export]]", 'name = "r5"', 'device = "r5"']
        (self.work / "strata.toml").write_text("\n".join(lines) + "\n")
        self.log = open(self.work / "server.log", "w")
        self.proc = subprocess.Popen([str(STRATA), "serve", "--config", str(self.work / "strata.toml")],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        for line in self.proc.stdout:
            if line.startswith("ready:"):
                break
        else:
            raise RuntimeError(f"strata exited; see {self.work / 'server.log'}")
        self.sock = self.work / "nbd.sock"

    def strata(self, *args: str) -> str:
        return subprocess.run([str(STRATA), *args, "--data-dir", str(self.work)] if args[0] == "status" else
                              [str(STRATA), *args], capture_output=True, text=True, check=True).stdout

    def node(self) -> dict:
        status = json.loads(subprocess.run([str(STRATA), "status", "--json", "--data-dir", str(self.work)],
                                           capture_output=True, text=True, check=True).stdout)

        def walk(node):
            yield node
            for child in node.get("children", []):
                yield from walk(child)
        for root in status["devices"]:
            for node in walk(root):
                if node["name"] == "r5":
                    return node
        raise RuntimeError("no r5 in status")

    def detail(self) -> dict:
        return {k: v for k, v in self.node().get("detail", [])}

    def grow(self, policy: str):
        subprocess.run([str(STRATA), "raid5", "grow", "--data-dir", str(self.work), "r5", "--add",
                        str(self.work / "d3.img"), "--policy", policy, "--detach"],
                       capture_output=True, text=True, check=True)

    def growing(self) -> bool:
        return "grow" in self.detail()

    def close(self):
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()
        subprocess.run(["rm", "-rf", str(self.work)])


def fio(sock: Path, *args: str) -> dict:
    argv = ["fio", "--name=bench", "--ioengine=nbd", f"--uri=nbd+unix:///r5?socket={sock}",
            "--output-format=json", *args]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("{"):])["jobs"][0]


def fill(server: Server):
    fio(server.sock, "--rw=write", "--bs=1M", "--iodepth=8", f"--size={3 * DISK_MIB}M")


def p99_ms(job: dict) -> float:
    """p99 completion latency over reads and writes together (the larger of the two)."""
    out = 0.0
    for side in ("read", "write"):
        pct = job[side].get("clat_ns", {}).get("percentile", {})
        if pct:
            out = max(out, pct.get("99.000000", 0) / 1e6)
    return out


def offline(policy: str) -> tuple[float, int]:
    server = Server()
    try:
        fill(server)
        rows = None
        start = time.monotonic()
        server.grow(policy)
        while server.growing():
            time.sleep(0.2)
        elapsed = time.monotonic() - start
        last = {k: v for k, v in server.detail().items() if k.startswith("last grow")}
        print(f"  {policy}: {elapsed:.1f} s from the command; engine: {last}", flush=True)
        node = server.node()
        rows = node["size"] // (3 * CHUNK)
        return elapsed, rows
    finally:
        server.close()


def under_load() -> dict:
    server = Server()
    try:
        fill(server)
        job = ["--rw=randrw", "--rwmixread=70", "--bs=4k", "--iodepth=8", f"--size={2 * DISK_MIB}M",
               "--time_based", f"--runtime={SECONDS}", "--randrepeat=0"]
        quiet = fio(server.sock, *job)
        server.grow("alv")
        during = fio(server.sock, *job)
        detail = server.detail()
        still = "grow" in detail
        while server.growing():
            time.sleep(0.5)
        return {"p99 quiet": p99_ms(quiet), "p99 during": p99_ms(during),
                "iops quiet": quiet["read"]["iops"] + quiet["write"]["iops"],
                "iops during": during["read"]["iops"] + during["write"]["iops"],
                "grow running throughout": still, "grow at end of job": detail.get("grow checkpoint", "done")}
    finally:
        server.close()


def main() -> int:
    bandwidth = parse_bw(MEMBER_BW)
    rows: dict[str, list] = {}
    for round_ in range(ROUNDS):
        print(f"round {round_ + 1}/{ROUNDS}", file=sys.stderr)
        for policy in ("alv", "md"):
            elapsed, stripes = offline(policy)
            rows.setdefault(f"offline {policy}", []).append(elapsed)
            rows["stripes"] = [stripes]
        load = under_load()
        for key, value in load.items():
            rows.setdefault(key, []).append(value)
    stripes = rows["stripes"][0]
    bound = 2 * stripes * CHUNK / bandwidth
    med = {k: statistics.median(v) for k, v in rows.items() if all(isinstance(x, (int, float)) for x in v)}
    print(f"\nraid5 3 -> 4 members, {DISK_MIB} MiB members limited to {MEMBER_BW}/s each (`delay`, {'O_DIRECT' if DIRECT else 'buffered'} "
          f"files), chunk 64 KiB, {stripes} stripes; {ROUNDS} round(s), medians.\n")
    print("| offline grow | seconds | against the bound | target |")
    print("|---|---:|---:|---|")
    print(f"| bandwidth bound (2 x {stripes} rows x 64 KiB per old member / {MEMBER_BW}/s) | {bound:.1f} | 1.00 | |")
    print(f"| ALV | {med['offline alv']:.1f} | **{med['offline alv'] / bound:.2f}x** | <= 1.15x |")
    print(f"| MD-Reshape | {med['offline md']:.1f} | {med['offline md'] / bound:.2f}x | |")
    print(f"| ALV / MD-Reshape | | {med['offline alv'] / med['offline md']:.2f} | (paper: 0.856) |")
    print(f"\n| 4 KiB randrw 70/30 QD8, {SECONDS} s | IOPS | p99 ms | target |")
    print("|---|---:|---:|---|")
    print(f"| no grow | {med['iops quiet']:,.0f} | {med['p99 quiet']:.2f} | |")
    print(f"| during an ALV grow | {med['iops during']:,.0f} | {med['p99 during']:.2f} | "
          f"p99 **{med['p99 during'] / med['p99 quiet']:.2f}x** of no grow (<= 1.5x) |")
    print(f"\nGrow still running at the end of the loaded job: {rows['grow running throughout']}; "
          f"its checkpoint then: {rows['grow at end of job']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
