#!/usr/bin/python3
"""Versions benchmark (issue 14's targets), side by side in one run.

Rows:
- 4 KiB random writes (QD32) to a 1 GiB thin volume, fully written first, right after it got
  its 1st, 10th and 100th snapshot, against the same volume with none (target: each >= 0.9x).
- The same right after one snapshot with `snapshot-write = "copy"` (dm-thin-like whole-extent
  copy-on-write; target: remap >= 2x copy), and a job of first writes only (one 4 KiB write
  into each extent right after a snapshot, remap and copy), and qemu-nbd serving a qcow2 with an internal
  snapshot and one at the top of a backing chain of 10 (target: strata >= 1.5x).
- Snapshot create latency through the admin socket, on the 1 GiB volume and on a 1 TiB volume
  with 32,768 extents mapped, each after a flush (a snapshot makes every acknowledged write
  durable first; flushing a dirty gigabyte is not the snapshot's own cost) (target: <= 10 ms).
- Server RSS growth per shared extent per snapshot over 89 snapshots taken in a row (target:
  <= 8 B).

Every pool uses 64 KiB extents (dm-thin's default block), so copy mode copies 64 KiB per first
write. Each write job starts right after the snapshot, for BENCH_SECONDS (default 10); the
first write into each extent after the snapshot is the remapped one, and a 10 s job at these
rates touches most of the volume's 16,384 extents. BENCH_ROUNDS rounds (default 3), medians.

Run: bench/versions.sh (BENCH_DIR=/dev/shm puts every disk image in memory, so that the rows
compare the layers' own paths rather than a disk file's; BENCH_DIRECT=1 opens every disk image
with O_DIRECT, Strata's `direct = true` and qemu-nbd's `--cache=none --aio=native`, so that
every layer's reads and writes reach the device as they would on a disk, not the page cache)
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layers import fio  # noqa: E402  (the same fio job runner)

ROOT = Path(__file__).resolve().parents[1]
STRATA = Path(os.environ.get("STRATA_BIN", ROOT / "target/release/strata"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
GIB = 1 << 30
EXTENT = 64 << 10
# Room for the volume (1 GiB), three write jobs' and the first-writes job's remapped extents
# (1 GiB each at most) and the 1 TiB volume's 2 GiB of mapped extents, with metadata.
DISK_GIB = 8
# Where the disk images go (default: the system's temporary directory).
WORK_DIR = os.environ.get("BENCH_DIR") or None
# O_DIRECT on every disk image: the device, not the page cache, takes each read and write.
DIRECT = os.environ.get("BENCH_DIRECT", "") not in ("", "0")


class Strata:
    """A strata server with one pool: volume `v` (1 GiB) and volume `big` (1 TiB)."""

    def __init__(self, snapshot_write: str):
        self.work = Path(tempfile.mkdtemp(prefix="strata-versions-bench.", dir=WORK_DIR))
        config = "\n".join([
            'listen = ["unix:nbd.sock"]', 'admin = "admin.sock"',
            "[[disk]]", 'name = "d0"', 'path = "d0.img"', f'size = "{DISK_GIB}GiB"', f"direct = {'true' if DIRECT else 'false'}",
            "[[layer]]", 'name = "pool"', 'kind = "thin-pool"', 'children = ["d0"]', 'extent = "64KiB"',
            f'snapshot-write = "{snapshot_write}"', 'commit-interval-ms = 1000',
            'volumes = [{ name = "v", size = "1GiB" }, { name = "big", size = "1TiB" }]',
            "[[export]]", 'name = "v"', 'device = "pool/v"',
            "[[export]]", 'name = "big"', 'device = "pool/big"',
        ]) + "\n"
        (self.work / "strata.toml").write_text(config)
        # The pool's disk is written in full first (zeros: a blank pool), so that writes land
        # in file blocks that exist, as on a disk. A first write into a hole of a sparse file
        # costs ext4 a delayed allocation and an extent insert (measured with perf: most of
        # the server's time in remap mode, whose 4 KiB writes each open a new hole, against
        # one per 64 KiB extent in copy mode): a cost of the emulation, not of the layer.
        subprocess.run(["dd", "if=/dev/zero", f"of={self.work / 'd0.img'}", "bs=4M",
                        f"count={DISK_GIB * 256}", "conv=fsync", "status=none"], check=True)
        self.log = open(self.work / "server.log", "w")
        self.proc = subprocess.Popen([str(STRATA), "serve", "--config", str(self.work / "strata.toml")],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        for line in self.proc.stdout:
            if line.startswith("ready:"):
                break
        else:
            raise RuntimeError(f"strata exited; see {self.work / 'server.log'}")
        self.sock = self.work / "nbd.sock"
        self.snapshots = 0

    def admin(self, request: dict) -> dict:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.work / "admin.sock"))
            s.sendall((json.dumps(request) + "\n").encode())
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
        answer = json.loads(reply)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def snapshot(self, volume: str = "v") -> float:
        """Takes a snapshot; returns how long the admin request took, in ms."""
        self.snapshots += 1
        request = {"cmd": "call", "layer": "pool", "verb": "snapshot-create",
                   "args": [["volume", volume], ["name", f"s{self.snapshots}"]]}
        start = time.perf_counter()
        self.admin(request)
        return (time.perf_counter() - start) * 1000

    def flush(self, export: str):
        """Makes the export's acknowledged writes durable (an NBD flush through libnbd)."""
        import nbd
        h = nbd.NBD()
        h.connect_uri(f"nbd+unix:///{export}?socket={self.sock}")
        h.flush()
        h.shutdown()

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def close(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)


def fill(sock: Path, export: str, size: str = "1G"):
    subprocess.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri=nbd+unix:///{export}?socket={sock}",
                    "--rw=write", "--bs=1M", "--iodepth=8", f"--size={size}"], capture_output=True, check=True)


def randwrite(sock: Path, export: str = "v") -> float:
    return fio(sock, export, "randwrite", 4096, 32, SECONDS, "1G", ramp=False)["iops"]


def first_writes(sock: Path, export: str = "v") -> float:
    """IOPS of 4 KiB writes (QD32), one into each 64 KiB extent, the extents in a random order
    and a random granule in each (16,384 writes): every write is the first into an extent the
    snapshot just taken shares, the one copy mode copies for. fio replays the list (the same
    list every run: seed 1)."""
    rng = random.Random(1)
    extents = list(range(GIB // EXTENT))
    rng.shuffle(extents)
    lines = ["fio version 2 iolog", "first.0.0 add", "first.0.0 open"]
    lines += [f"first.0.0 write {e * EXTENT + rng.randrange(EXTENT // 4096) * 4096} 4096" for e in extents]
    lines.append("first.0.0 close")
    with tempfile.NamedTemporaryFile("w", suffix=".iolog") as iolog:
        iolog.write("\n".join(lines) + "\n")
        iolog.flush()
        out = subprocess.run(["fio", "--name=first", "--ioengine=nbd", f"--uri=nbd+unix:///{export}?socket={sock}",
                              f"--read_iolog={iolog.name}", "--iodepth=32", "--size=1G", "--output-format=json"],
                             capture_output=True, check=True, text=True)
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]["write"]
    assert job["total_ios"] == len(extents), job["total_ios"]
    return job["iops"]


class QemuNbd:
    """qemu-nbd serving a qcow2: one with an internal snapshot, or the top of a chain of 10."""

    def __init__(self, chain: int):
        self.work = Path(tempfile.mkdtemp(prefix="strata-versions-qemu.", dir=WORK_DIR))
        base = self.work / "base.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "1G"], check=True)
        self.sock = self.work / "nbd.sock"
        self.serve(base)
        fill(self.sock, "")
        self.stop()
        top = base
        if chain == 0:
            subprocess.run(["qemu-img", "snapshot", "-c", "s1", str(base)], check=True)
        for i in range(chain):
            overlay = self.work / f"o{i}.qcow2"
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(top), "-F", "qcow2",
                            str(overlay)], check=True)
            top = overlay
        self.serve(top)

    def serve(self, image: Path):
        cache = ["--cache=none", "--aio=native"] if DIRECT else ["--cache=writeback", "--aio=threads"]
        self.proc = subprocess.Popen(["qemu-nbd", "-f", "qcow2", "-t", *cache,
                                      "-k", str(self.sock), str(image)], stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not self.sock.exists() and time.time() < deadline:
            time.sleep(0.05)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.sock.unlink(missing_ok=True)

    def close(self):
        self.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def one_round(rows: dict[str, list[float]]):
    def add(key: str, value: float):
        rows.setdefault(key, []).append(value)

    remap = Strata("remap")
    try:
        fill(remap.sock, "v")
        add("none", randwrite(remap.sock))
        # What a snapshot costs itself: the writes before it are made durable first (a
        # snapshot holds every acknowledged write), so flush them before timing it.
        remap.flush("v")
        add("create 1 GiB", remap.snapshot())
        add("1", randwrite(remap.sock))
        for _ in range(8):
            remap.snapshot()
        remap.flush("v")
        add("create 1 GiB (10th)", remap.snapshot())
        add("10", randwrite(remap.sock))
        remap.flush("v")
        # 89 snapshots in a row with no write between: what each costs in memory.
        rss_before = remap.rss_kib()
        for _ in range(89):
            remap.snapshot()
        rss_after = remap.rss_kib()
        add("rss per shared extent per snapshot", max(0, rss_after - rss_before) * 1024 / (16384 * 89))
        add("create 1 GiB (100th)", remap.snapshot())
        add("100", randwrite(remap.sock))
        remap.flush("v")
        remap.snapshot()
        add("first remap", first_writes(remap.sock))
        # The 1 TiB volume: one 4 KiB write every 32 MiB maps 32,768 extents (2 GiB of them).
        subprocess.run(["fio", "--name=map", "--ioengine=nbd", f"--uri=nbd+unix:///big?socket={remap.sock}",
                        "--rw=write:32764k", "--bs=4k", "--iodepth=32", "--size=1T", "--number_ios=32768",
                        "--end_fsync=1"], capture_output=True, check=True)
        add("create 1 TiB", remap.snapshot("big"))
    finally:
        remap.close()
    copy = Strata("copy")
    try:
        fill(copy.sock, "v")
        copy.snapshot()
        add("copy", randwrite(copy.sock))
        copy.flush("v")
        copy.snapshot()
        add("first copy", first_writes(copy.sock))
    finally:
        copy.close()
    for chain, key in ((0, "qcow2 internal snapshot"), (10, "qcow2 chain of 10")):
        qemu = QemuNbd(chain)
        try:
            add(key, randwrite(qemu.sock, ""))
        finally:
            qemu.close()


def main() -> int:
    rows: dict[str, list[float]] = {}
    for round_ in range(ROUNDS):
        print(f"round {round_ + 1}/{ROUNDS}", file=sys.stderr)
        one_round(rows)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\n4 KiB random writes, QD32, {SECONDS} s right after the snapshot, 1 GiB volume fully written, "
          f"64 KiB extents; {ROUNDS} rounds, medians; disk images in {WORK_DIR or tempfile.gettempdir()}"
          f"{', O_DIRECT' if DIRECT else ''}.\n")
    print("| workload | IOPS | ratio | target |")
    print("|---|---:|---:|---|")
    print(f"| no snapshot | {med['none']:,.0f} | 1.00 | |")
    for n in ("1", "10", "100"):
        print(f"| after snapshot {n} | {med[n]:,.0f} | **{med[n] / med['none']:.2f}x** of none | >= 0.9x |")
    print(f"| first writes after a snapshot (one per extent, random order): remap / copy | {med['first remap']:,.0f} / "
          f"{med['first copy']:,.0f} | remap/copy **{med['first remap'] / med['first copy']:.2f}x** | >= 2x |")
    print(f"| copy mode (dm-thin-like), after 1: {SECONDS} s, mostly writes after each extent's first "
          f"| {med['copy']:,.0f} | remap/copy {med['1'] / med['copy']:.2f}x | |")
    for key in ("qcow2 internal snapshot", "qcow2 chain of 10"):
        print(f"| qemu-nbd, {key} | {med[key]:,.0f} | strata/qemu **{med['1'] / med[key]:.2f}x** | >= 1.5x |")
    print("\n| snapshot create (admin request, ms) | median | target |")
    print("|---|---:|---|")
    for key in ("create 1 GiB", "create 1 GiB (10th)", "create 1 GiB (100th)", "create 1 TiB"):
        print(f"| {key} | {med[key]:.2f} | <= 10 |")
    print(f"\nRSS growth per shared extent per snapshot (89 snapshots in a row of 16,384 extents): "
          f"**{med['rss per shared extent per snapshot']:.3f} B** (target <= 8 B)")
    print("\nPer round: " + "; ".join(f"{k}: {', '.join(f'{x:,.1f}' for x in v)}" for k, v in rows.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
