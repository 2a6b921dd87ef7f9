#!/usr/bin/python3
"""Thin pool benchmark (issue 5's targets), peers side by side in one run.

Every disk is a buffered file (`direct = false`) in one work folder on one host filesystem,
and every client is fio's nbd engine over a unix socket, one connection, queue depth 8. Rows:

- 4 KiB random writes into allocated extents: a thin volume whose every granule was written
  once (sequential fill) vs the raw file disk exported directly by the same server, also
  filled once. Target >= 0.95x: an overwrite of live granules costs one child write.
- 4 KiB random writes into a fresh volume (no extent mapped yet), one pass over the whole
  volume: fio's random map sends each offset exactly once, so every write is the first into
  its 4 KiB granule (a metadata change) and the first write into each 512 KiB extent
  allocates it; vs the same filled raw disk (time-based). Target >= 0.7x. A new fresh volume
  is used in every round.
- Strata thin vs qemu-nbd serving a qcow2 image (`qemu-img create -f qcow2`, default options:
  64 KiB clusters, no preallocation) with `--cache=writeback --aio=threads` (qemu-nbd's
  default cache mode and AIO mode, spelled out; the same host page cache strata's buffered
  disks use): 4 KiB random writes and 1 MiB sequential writes into allocated space (both
  filled once), target >= 1.5x each; and, for information, 4 KiB random writes into fresh
  space (fresh volume vs a new qcow2 image).
- For information, the first-write job again on a pool with `map-commit = "extent"` (the
  paper's extent-based hardening: a write that maps an extent completes once the mapping is
  durable, data flushed first).

Each round runs every job once, in turn, so that drift in this shared machine's speed hits
all of them alike; the table reports the median of the rounds. Before every job the disk
files and images are written back and their page cache dropped (see `drop_cache`), so that no
job inherits another's dirty pages or page-cache layout.

Run: bench/thin.sh (BENCH_SECONDS per job, default 10; BENCH_ROUNDS, default 3;
BENCH_SIZE_MIB per volume/disk/image, default 1024; BENCH_QEMU_FLAGS to try other qemu-nbd
settings). The work folder is removed at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATA = Path(os.environ.get("STRATA_BIN", ROOT / "target/release/strata"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SIZE_MIB = int(os.environ.get("BENCH_SIZE_MIB", "1024"))
QD = 8
EXTENT = 512 * 1024  # the pool's extent (the paper's default)
QEMU_NBD_FLAGS = os.environ.get("BENCH_QEMU_FLAGS", "--cache=writeback --aio=threads").split()


def config() -> str:
    size = f"{SIZE_MIB}MiB"
    # The pool holds the filled volume plus one fresh volume per round, each possibly fully
    # allocated, plus its metadata.
    pool_mib = SIZE_MIB * (ROUNDS + 1) + 64
    volumes = [f'{{ name = "filled", size = "{size}" }}']
    volumes += [f'{{ name = "fresh{r}", size = "{size}" }}' for r in range(ROUNDS)]
    lines = ['listen = ["unix:nbd.sock"]', 'admin = "admin.sock"',
             "[[disk]]", 'name = "raw"', 'path = "raw.img"', f'size = "{size}"', "direct = false",
             "[[disk]]", 'name = "pooldisk"', 'path = "pool.img"', f'size = "{pool_mib}MiB"', "direct = false",
             "[[layer]]", 'name = "pool"', 'kind = "thin-pool"', 'children = ["pooldisk"]', f'extent = "{EXTENT}"',
             f"volumes = [{', '.join(volumes)}]",
             "[[export]]", 'name = "raw"', 'device = "raw"',
             "[[export]]", 'name = "filled"', 'device = "pool/filled"']
    # The same fresh volumes in a pool that makes every mapping durable before the write that
    # made it completes (the paper's extent-based hardening).
    xvolumes = [f'{{ name = "fresh{r}", size = "{size}" }}' for r in range(ROUNDS)]
    lines += ["[[disk]]", 'name = "xpooldisk"', 'path = "xpool.img"', f'size = "{SIZE_MIB * ROUNDS + 64}MiB"',
              "direct = false",
              "[[layer]]", 'name = "xpool"', 'kind = "thin-pool"', 'children = ["xpooldisk"]', f'extent = "{EXTENT}"',
              'map-commit = "extent"', f"volumes = [{', '.join(xvolumes)}]"]
    for r in range(ROUNDS):
        lines += ["[[export]]", f'name = "fresh{r}"', f'device = "pool/fresh{r}"']
        lines += ["[[export]]", f'name = "xfresh{r}"', f'device = "xpool/fresh{r}"']
    return "\n".join(lines) + "\n"


def drop_cache(work: Path) -> None:
    """Writes back and drops the page cache of every disk file and image, so that each job
    starts from the same state. Measured: after a 1 MiB sequential fill, 4 KiB random writes
    to the raw disk export ran at ~30k IOPS, and at ~130k once its cache was dropped (cause
    not pinned down; see docs/thin-experiments.md)."""
    os.sync()
    for path in list(work.glob("*.img")) + list(work.glob("*.qcow2")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def fio(sock: Path, export: str, rw: str, bs: str, seconds: int | None) -> dict:
    """One fio job over NBD at QD8: time-based with a 2 s ramp, or, with `seconds` None, one
    pass over the whole size without ramp (a fill, or a first-write job: fio's random map,
    kept on, sends each 4 KiB offset exactly once, so every write finds its block unwritten)."""
    argv = ["fio", "--name=bench", "--ioengine=nbd", f"--uri=nbd+unix:///{export}?socket={sock}",
            f"--rw={rw}", f"--bs={bs}", f"--iodepth={QD}", "--numjobs=1", f"--size={SIZE_MIB}M",
            "--randrepeat=0", "--refill_buffers", "--output-format=json"]
    if seconds is not None:
        argv += ["--time_based", f"--runtime={seconds}", "--ramp_time=2"]
    drop_cache(sock.parent)
    proc = subprocess.run(argv, capture_output=True, text=True)
    out = proc.stdout
    if proc.returncode != 0 or "{" not in out:
        raise RuntimeError(f"fio {export} {rw} {bs} failed: {proc.stderr[-2000:]}{out[-2000:]}")
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write"]
    return {"mib_s": side["bw_bytes"] / 2**20, "iops": side["iops"], "ios": side["total_ios"],
            "p99_us": side.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1000}


def pool_allocated(work: Path) -> int:
    out = subprocess.run([str(STRATA), "status", "--json", "--data-dir", str(work)], capture_output=True,
                         text=True, check=True).stdout
    pool = next(d for d in json.loads(out)["devices"] if d["kind"] == "thin-pool" and d["name"] == "pool")
    return int(dict(pool["detail"])["extents allocated"].split()[0])


def wait_socket(path: Path, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up")


class QemuNbd:
    """qemu-nbd serving one qcow2 image as export `bench` on its own socket."""

    def __init__(self, work: Path, image: Path):
        self.sock = work / "qemu.sock"
        self.log = open(work / "qemu-nbd.log", "a")
        self.proc = subprocess.Popen(["qemu-nbd", "-f", "qcow2", "-t", "-e", "4", "-x", "bench", "-k", str(self.sock),
                                      *QEMU_NBD_FLAGS, str(image)], stdout=self.log, stderr=subprocess.STDOUT)
        wait_socket(self.sock, self.proc, "qemu-nbd")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()
        self.sock.unlink(missing_ok=True)


def new_qcow2(path: Path) -> Path:
    path.unlink(missing_ok=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), f"{SIZE_MIB}M"], check=True)
    return path


def main() -> int:
    for tool in ("fio", "qemu-nbd", "qemu-img"):
        if not shutil.which(tool):
            print(f"missing {tool} (apt-get install fio qemu-utils)", file=sys.stderr)
            return 1
    work = Path(tempfile.mkdtemp(prefix="strata-thin-bench.", dir="/tmp"))
    (work / "strata.toml").write_text(config())
    log = open(work / "server.log", "w")
    server = subprocess.Popen([str(STRATA), "serve", "--config", str(work / "strata.toml")], stdout=subprocess.PIPE,
                              stderr=log, text=True)
    qemu: QemuNbd | None = None
    try:
        for line in server.stdout:
            if line.startswith("ready:"):
                break
        else:
            raise RuntimeError(f"strata exited: {(work / 'server.log').read_text()[-2000:]}")
        sock = work / "nbd.sock"
        rows: dict[str, list[float]] = {}

        def add(key: str, value: float) -> None:
            rows.setdefault(key, []).append(value)

        # Precondition: the raw disk, the filled volume and one qcow2 image written once, end
        # to end, so that the "allocated" rows overwrite allocated space everywhere (host
        # file blocks included: a first write into a hole of the host file costs the host
        # filesystem an allocation that is not the thin pool's doing).
        print("filling raw disk, thin volume and qcow2 image once", file=sys.stderr)
        fio(sock, "raw", "write", "1M", None)
        fio(sock, "filled", "write", "1M", None)
        qcow_filled = new_qcow2(work / "filled.qcow2")
        qemu = QemuNbd(work, qcow_filled)
        fio(qemu.sock, "bench", "write", "1M", None)
        qemu.stop()
        qemu = None
        filled_extents = pool_allocated(work)
        assert filled_extents == SIZE_MIB * 2**20 // EXTENT, f"fill mapped {filled_extents} extents"

        for r in range(ROUNDS):
            print(f"round {r + 1}/{ROUNDS}", file=sys.stderr)
            add("raw rand", fio(sock, "raw", "randwrite", "4k", SECONDS)["iops"])
            add("filled rand", fio(sock, "filled", "randwrite", "4k", SECONDS)["iops"])
            before = pool_allocated(work)
            fresh = fio(sock, f"fresh{r}", "randwrite", "4k", None)
            allocated = pool_allocated(work) - before
            add("fresh rand", fresh["iops"])
            add("fresh writes", fresh["ios"])
            add("fresh extents", allocated)
            add("xfresh rand", fio(sock, f"xfresh{r}", "randwrite", "4k", None)["iops"])
            add("filled seq", fio(sock, "filled", "write", "1M", SECONDS)["mib_s"])
            add("raw seq", fio(sock, "raw", "write", "1M", SECONDS)["mib_s"])
            qemu = QemuNbd(work, qcow_filled)
            add("qcow2 rand", fio(qemu.sock, "bench", "randwrite", "4k", SECONDS)["iops"])
            add("qcow2 seq", fio(qemu.sock, "bench", "write", "1M", SECONDS)["mib_s"])
            qemu.stop()
            qemu = QemuNbd(work, new_qcow2(work / "fresh.qcow2"))
            add("qcow2 fresh rand", fio(qemu.sock, "bench", "randwrite", "4k", None)["iops"])
            qemu.stop()
            qemu = None
            (work / "fresh.qcow2").unlink()
        med = {k: statistics.median(v) for k, v in rows.items()}
        print_table(med, rows)
        return 0
    finally:
        if qemu is not None:
            qemu.stop()
        server.terminate()
        server.wait(60)
        log.close()
        # The disk files and images grow to gigabytes over a run.
        shutil.rmtree(work, ignore_errors=True)


def print_table(med: dict[str, float], rows: dict[str, list[float]]) -> None:
    def ratio(a: str, b: str) -> str:
        return f"**{med[a] / med[b]:.2f}x**"

    load = os.getloadavg()
    print(f"\nfio nbd engine over a unix socket, one connection, QD{QD}; buffered file disks on one host "
          f"filesystem; {ROUNDS} rounds x {SECONDS} s, medians; volumes, disk and images {SIZE_MIB} MiB; pool "
          f"extent {EXTENT // 1024} KiB; qemu-nbd {' '.join(QEMU_NBD_FLAGS)}; load average at the end "
          f"{load[0]:.2f}.\n")
    print("| workload | baseline | Strata thin | ratio | target |")
    print("|---|---:|---:|---:|---|")
    print(f"| 4 KiB random write, allocated extents: thin vs raw disk | {med['raw rand']:.0f} IOPS | "
          f"{med['filled rand']:.0f} IOPS | {ratio('filled rand', 'raw rand')} | >= 0.95x |")
    print(f"| 4 KiB random write, first writes (fresh volume): thin vs raw disk | {med['raw rand']:.0f} IOPS | "
          f"{med['fresh rand']:.0f} IOPS | {ratio('fresh rand', 'raw rand')} | >= 0.7x |")
    print(f"| 4 KiB random write, first writes, `map-commit = \"extent\"` (information) | {med['raw rand']:.0f} IOPS | "
          f"{med['xfresh rand']:.0f} IOPS | {ratio('xfresh rand', 'raw rand')} | |")
    print(f"| 4 KiB random write, allocated: thin vs qemu-nbd qcow2 | {med['qcow2 rand']:.0f} IOPS | "
          f"{med['filled rand']:.0f} IOPS | {ratio('filled rand', 'qcow2 rand')} | >= 1.5x |")
    print(f"| 1 MiB sequential write, allocated: thin vs qemu-nbd qcow2 | {med['qcow2 seq']:.0f} MiB/s | "
          f"{med['filled seq']:.0f} MiB/s | {ratio('filled seq', 'qcow2 seq')} | >= 1.5x |")
    print(f"| 4 KiB random write, fresh: thin vs qemu-nbd new qcow2 (information) | "
          f"{med['qcow2 fresh rand']:.0f} IOPS | {med['fresh rand']:.0f} IOPS | "
          f"{ratio('fresh rand', 'qcow2 fresh rand')} | |")
    print(f"| 1 MiB sequential write, allocated: thin vs raw disk (information) | {med['raw seq']:.0f} MiB/s | "
          f"{med['filled seq']:.0f} MiB/s | {ratio('filled seq', 'raw seq')} | |")
    share = med["fresh extents"] / max(1, med["fresh writes"])
    print(f"\nFirst-write row: {med['fresh writes']:.0f} writes per job, of which {med['fresh extents']:.0f} "
          f"({share:.1%}) allocated a new extent; every write made its 4 KiB granule live (a metadata "
          f"change).")
    print("\nPer round (IOPS or MiB/s): " + "; ".join(
        f"{k} {', '.join(f'{v:.0f}' for v in vs)}" for k, vs in rows.items() if k not in ("fresh writes",)))


if __name__ == "__main__":
    sys.exit(main())
