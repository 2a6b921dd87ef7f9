#!/usr/bin/python3
"""Proximal I/O in real mode (issue 16): 4 KiB random writes to a `stage` over a modelled disk,
side by side with the disk alone and with the same stage writing back in address order.

The slow child is a file under an `hdd` layer: every request completes when the simulator's
calibrated WD RE3 model (`wd-re3-1t`: 7,200 RPM, SPTF over an 8-command queue) says it does,
so positions and queueing cost what they cost on that drive, while the bytes go to the file.
The fast child is a plain file on this machine's SSD. Three exports, each over its own
modelled disk and file (same size, same model, same seed):

- `alone`: the modelled disk alone;
- `stage`: a stage over [flash, disk], its log `BENCH_STAGING_PERCENT` (default 1) % of the
  volume, density trigger at the batch a full log would make (log slots / extents: 41 at
  1 % of 100 GiB), destaging in the background as each extent reaches it, each batch handed
  to the disk at once (the default);
- `inorder`: the same stage with `destage-depth = 1`: batches in address order, one request at
  a time, what bcache and dm-writecache do.

Method: fio's nbd engine, 4 KiB random writes at queue depth 32 over the whole volume. For the
stages, writes come first until the log is full (85 % of its slots busy: in the steady state
it swings between 7/8 and full), so that the measured
run is in the steady state, where writes are admitted as fast as destages make room. Then
`BENCH_SECONDS` (default 30) measured. Even a full log has slack (it swings between 7/8 and
full), so in a window of a minute a stage admits more writes than its disk retires: the
ratios compare the *sustained* rate, what the disk retired per second (the stage's destaged
blocks; the disk alone's writes). The client IOPS and the disk I/Os per client write are
shown beside it (under 1: the log absorbed writes it had not destaged yet).
Each round measures every export in turn; medians of `BENCH_ROUNDS` (default 3).

The disk's I/Os per revolution: the requests its `hdd` node served during the measured run
(its Describe counter) over the revolutions that elapsed. Idle time counts, so it is at most
the paper's figure (§5.3: revolution / mean service time of the I/Os of a batch).

Targets (issue 16): stage >= 3x the disk alone, and >= 1.5x the in-order write-back.

Run: bench/stage.sh. BENCH_VOLUME_GIB (default 100) sets the volume: files are sparse, and the
span the random writes cover sets the disk's seek distances (100 GiB is a tenth of the
drive).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATA = Path(os.environ.get("STRATA_BIN", ROOT / "target/release/strata"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "30"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
VOLUME_GIB = int(os.environ.get("BENCH_VOLUME_GIB", "100"))
STAGING_PERCENT = float(os.environ.get("BENCH_STAGING_PERCENT", "1"))
MODEL = os.environ.get("BENCH_MODEL", "wd-re3-1t")
REVOLUTION_MS = 60_000 / 7_200
BLOCK = 4096
EXPORTS = ("alone", "stage", "inorder")
# A log this busy counts as full: in the steady state the log swings between 7/8 (after the
# backstop destaged an eighth) and full.
FULL = 0.85


def log_bytes() -> int:
    return int(VOLUME_GIB * 2**30 * STAGING_PERCENT / 100) // BLOCK * BLOCK


def density() -> int:
    """Staged blocks per extent when the log is full of uniformly random writes: the batch a
    full-log destage would make, taken as each extent reaches it."""
    extents = VOLUME_GIB * 2**30 // (16 << 20)
    return max(8, log_bytes() // BLOCK // extents)


def metadata_bytes() -> int:
    # The stage's default formula (StageConfig::metadata_bytes), written out so that the fast
    # file can be sized to hold exactly the log after it.
    slots = log_bytes() // BLOCK
    blocks = VOLUME_GIB * 2**30 // BLOCK
    mib = 1 << 20
    return -(-max(96 * slots + 4 * blocks, mib) // mib) * mib


def config() -> str:
    lines = ['listen = ["unix:nbd.sock"]', 'admin = "admin.sock"']
    fast_size = metadata_bytes() + log_bytes()
    for export in EXPORTS:
        lines += ["[[disk]]", f'name = "{export}-file"', f'path = "{export}.img"', f'size = "{VOLUME_GIB}GiB"',
                  "direct = true"]
        lines += ["[[layer]]", f'name = "{export}-disk"', 'kind = "hdd"', f'children = ["{export}-file"]',
                  f'model = "{MODEL}"']
    for export in ("stage", "inorder"):
        lines += ["[[disk]]", f'name = "{export}-flash"', f'path = "{export}-flash.img"', f"size = {fast_size}",
                  "direct = true"]
        lines += ["[[layer]]", f'name = "{export}"', 'kind = "stage"', f'children = ["{export}-flash", "{export}-disk"]',
                  'trigger = "density"', f"density = {density()}", f"metadata-size = {metadata_bytes()}"]
        if export == "inorder":
            lines += ["destage-depth = 1"]
    lines += ["[[export]]", 'name = "alone"', 'device = "alone-disk"']
    for export in ("stage", "inorder"):
        lines += ["[[export]]", f'name = "{export}"', f'device = "{export}"']
    return "\n".join(lines) + "\n"


def fio(sock: Path, export: str, seconds: int | None = None, ios: int | None = None) -> dict:
    argv = ["fio", "--name=bench", "--ioengine=nbd", f"--uri=nbd+unix:///{export}?socket={sock}",
            "--rw=randwrite", f"--bs={BLOCK}", "--iodepth=32", f"--size={VOLUME_GIB}G", "--randrepeat=0",
            "--output-format=json"]
    argv += ["--time_based", f"--runtime={seconds}"] if seconds else [f"--number_ios={ios}"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    out = proc.stdout
    if proc.returncode != 0 or "{" not in out:
        raise RuntimeError(f"fio {export} failed: {proc.stderr[-2000:]}{out[-2000:]}")
    job = json.loads(out[out.index("{"):])["jobs"][0]["write"]
    p99 = job.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1e6
    return {"iops": job["iops"], "ios": job["total_ios"], "p99_ms": p99}


def walk(node):
    yield node
    for child in node.get("children", []):
        yield from walk(child)


class Server:
    def __init__(self):
        self.work = Path(tempfile.mkdtemp(prefix="strata-stage-bench."))
        (self.work / "strata.toml").write_text(config())
        self.log = open(self.work / "server.log", "w")
        self.proc = subprocess.Popen([str(STRATA), "serve", "--config", str(self.work / "strata.toml")],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=self.work)
        for line in self.proc.stdout:
            if line.startswith("ready:"):
                break
        else:
            raise RuntimeError(f"server exited; see {self.work / 'server.log'}")
        self.sock = self.work / "nbd.sock"
        self.rows: dict[str, list[float]] = {}

    def status(self) -> dict:
        out = subprocess.run([str(STRATA), "status", "--json", "--data-dir", str(self.work)], capture_output=True,
                             text=True, check=True).stdout
        return json.loads(out)

    def node(self, name: str) -> dict:
        for top in self.status()["devices"]:
            for node in walk(top):
                if node["name"] == name:
                    return node
        raise KeyError(name)

    def detail(self, name: str) -> dict[str, str]:
        return {k: v for k, v in self.node(name).get("detail", [])}

    def add(self, key: str, value: float):
        self.rows.setdefault(key, []).append(value)

    def log_busy(self, export: str) -> float:
        """The fraction of `export`'s log slots in use (its `log` status line)."""
        line = self.detail(export)["log"]  # "N of M slots busy (P %)"
        busy, _, slots = line.split()[:3]
        return int(busy) / int(slots)

    def fill_logs(self):
        for export in ("stage", "inorder"):
            fio(self.sock, export, ios=log_bytes() // BLOCK)

    def top_up(self, export: str):
        """Writes until `export`'s log is full: then writes are admitted only as fast as
        destages make room (the steady state). Before every measured run: the background
        destager drains the log while the other exports are measured."""
        while self.log_busy(export) < FULL:
            fio(self.sock, export, ios=log_bytes() // BLOCK // 16)
        print(f"{export}: log {self.log_busy(export):.1%} busy", file=sys.stderr)

    def destaged(self, export: str) -> int:
        """Blocks on the stage's slow child: finished destages, plus what the running one has
        written (a destage of an eighth of the log takes most of a minute here)."""
        node = self.node(export)
        running = (node.get("activity") or {}).get("done_bytes", 0) // BLOCK
        return int(dict(node["detail"])["destaged blocks"]) + running

    def measure(self, export: str):
        if export != "alone":
            self.top_up(export)
        disk = f"{export}-disk"
        destaged = (lambda: self.destaged(export)) if export != "alone" else (lambda: 0)
        before, destaged_before, started = int(self.detail(disk)["requests"]), destaged(), time.monotonic()
        result = fio(self.sock, export, seconds=SECONDS)
        requests = int(self.detail(disk)["requests"]) - before
        elapsed_ms = (time.monotonic() - started) * 1000
        self.add(f"{export} iops", result["iops"])
        # What the slow child retired: client writes for the disk alone, destaged blocks for a
        # stage. The sustained rate: a stage admits more only while its log has slack.
        retired = result["ios"] if export == "alone" else destaged() - destaged_before
        self.add(f"{export} sustained", retired / (elapsed_ms / 1000))
        self.add(f"{export} p99", result["p99_ms"])
        self.add(f"{export} ios per rev", requests / (elapsed_ms / REVOLUTION_MS))
        self.add(f"{export} disk ios per write", requests / max(1, result["ios"]))

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.rows.items()}

    def close(self):
        self.proc.terminate()
        try:
            # A clean stop waits for a running destage; the in-order one can take minutes.
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)


def table(med: dict[str, float]):
    alone, stage, inorder = (med[f"{e} sustained"] for e in EXPORTS)
    print("| export | 4 KiB random writes/s sustained | client IOPS, QD32 | p99 ms | disk I/Os per revolution "
          "| disk I/Os per write |")
    print("|---|---:|---:|---:|---:|---:|")
    labels = {"alone": "modelled disk alone", "stage": "stage (batch at once)",
              "inorder": "stage, destage-depth 1 (in-order write-back)"}
    for export in EXPORTS:
        rev = med.get(f"{export} ios per rev", 0)
        per = med.get(f"{export} disk ios per write", 0)
        print(f"| {labels[export]} | {med[export + ' sustained']:.0f} | {med[export + ' iops']:.0f} "
              f"| {med[export + ' p99']:.1f} | {rev:.2f} | {per:.2f} |")
    print()
    print("| ratio (sustained) | measured | target |")
    print("|---|---:|---|")
    print(f"| stage / disk alone | **{stage / alone:.2f}x** | >= 3x |")
    print(f"| stage / in-order write-back | **{stage / inorder:.2f}x** | >= 1.5x |")


def main() -> int:
    server = Server()
    try:
        print(f"filling both logs ({log_bytes() >> 20} MiB each)", file=sys.stderr)
        server.fill_logs()
        for round_ in range(ROUNDS):
            for export in EXPORTS:
                print(f"round {round_ + 1}/{ROUNDS}: {export}", file=sys.stderr)
                server.measure(export)
        print(f"\nModel {MODEL} over a {VOLUME_GIB} GiB file per export; staging {STAGING_PERCENT:g} % "
              f"({log_bytes() >> 20} MiB log on a file); {ROUNDS} rounds x {SECONDS} s, medians.\n")
        table(server.medians())
        return 0
    finally:
        server.close()


if __name__ == "__main__":
    sys.exit(main())
