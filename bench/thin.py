#!/usr/bin/python3
"""Thin pool benchmark (issue 5's targets), peers side by side in one run.

Every client is fio's nbd engine over a unix socket, one connection, queue depth 8. Two disk
setups, because the targets ask two different questions:

**Thin against the same stack without thin: O_DIRECT file disks** (`direct = true`), written
end to end before the server starts so that the host filesystem has allocated every block,
as on a real disk. A buffered file is not a disk: a write to it is a copy into the page cache
that never reaches storage during a job, while the pool's metadata commit (every second, as
dm-thin) must flush the data it maps first, which on a buffered file is an fdatasync of every
dirty page. The buffered comparison pits durable against not durable; it is printed too, for
information.

- 4 KiB random writes into allocated extents: a thin volume whose every granule was written
  once (sequential fill) vs the raw disk exported directly by the same server, also filled
  once. Target >= 0.95x: an overwrite of live granules costs one child write.
- 4 KiB random writes into a fresh volume (no extent mapped yet), one pass over the whole
  volume: fio's random map sends each offset exactly once, so every write is the first into
  its 4 KiB granule (a metadata change) and the first write into each 512 KiB extent
  allocates it; vs the raw disk's time-based job. Target >= 0.7x. A new fresh volume is used
  in every round.
- For information, the first-write job on a pool with `map-commit = "extent"` (the paper's
  extent-based hardening: a write that changes the map completes once the change is
  durable, data flushed first).

**Thin against qemu-nbd serving a qcow2 image** (`qemu-img create -f qcow2`, default options:
64 KiB clusters, no preallocation): both servers on the host page cache, qemu-nbd with
`--cache=writeback --aio=threads` (its default cache mode and AIO mode, spelled out) and
Strata on buffered file disks (its default). 4 KiB random writes and 1 MiB sequential writes
into allocated space (both filled once), target >= 1.5x each; for information, 4 KiB random
writes into fresh space (fresh volume vs a new qcow2 image), the buffered first-write job
against a buffered raw disk, and the O_DIRECT pair (qemu-nbd `--cache=none` against the
O_DIRECT thin volume).

Each round runs every job once, in turn, so that drift in this shared machine's speed hits
all of them alike; the table reports the median of the rounds. Before every job the disk
files and images are written back and their page cache dropped (see `drop_cache`), so that no
job inherits another's dirty pages or page-cache layout.

Run: bench/thin.sh (BENCH_SECONDS per job, default 10; BENCH_ROUNDS, default 3;
BENCH_SIZE_MIB per volume/disk/image, default 1024; BENCH_QEMU_FLAGS to try other qemu-nbd
writeback settings). The work folder is removed at the end.
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


QEMU_DIRECT_FLAGS = ["--cache=none", "--aio=threads"]


def pool_mib(volumes: int) -> int:
    # Each volume possibly fully allocated, plus the pool's metadata.
    return SIZE_MIB * volumes + 64


def config() -> str:
    """One server: raw disks and thin pools on O_DIRECT disks (`d`) and on buffered ones (`b`),
    and a pool with `map-commit = "extent"` on an O_DIRECT disk (`x`)."""
    size = f"{SIZE_MIB}MiB"
    lines = ['listen = ["unix:nbd.sock"]', 'admin = "admin.sock"']

    def disk(name: str, mib: int, direct: bool) -> None:
        lines.extend(["[[disk]]", f'name = "{name}"', f'path = "{name}.img"', f'size = "{mib}MiB"',
                      f"direct = {'true' if direct else 'false'}"])

    def export(name: str, device: str) -> None:
        lines.extend(["[[export]]", f'name = "{name}"', f'device = "{device}"'])

    def pool(name: str, disk_name: str, volumes: list[str], extra: str = "") -> None:
        listed = ", ".join(f'{{ name = "{v}", size = "{size}" }}' for v in volumes)
        lines.extend(["[[layer]]", f'name = "{name}"', 'kind = "thin-pool"', f'children = ["{disk_name}"]',
                      f'extent = "{EXTENT}"', *([extra] if extra else []), f"volumes = [{listed}]"])
        for v in volumes:
            export(f"{name}-{v}", f"{name}/{v}")

    fresh = [f"fresh{r}" for r in range(ROUNDS)]
    for prefix, direct in (("d", True), ("b", False)):
        disk(f"{prefix}raw", SIZE_MIB, direct)
        export(f"{prefix}raw", f"{prefix}raw")
        disk(f"{prefix}pooldisk", pool_mib(ROUNDS + 1), direct)
        pool(f"{prefix}pool", f"{prefix}pooldisk", ["filled", *fresh])
    disk("xpooldisk", pool_mib(ROUNDS), True)
    pool("xpool", "xpooldisk", fresh, 'map-commit = "extent"')
    return "\n".join(lines) + "\n"


def disk_files() -> dict[str, int]:
    """Every disk file and its size in MiB, to be written end to end before the server starts
    (a real disk has every block; a hole in a host file costs an allocation on first write,
    and an O_DIRECT write into a hole is slower still)."""
    files = {f"{p}raw.img": SIZE_MIB for p in "db"}
    files.update({f"{p}pooldisk.img": pool_mib(ROUNDS + 1) for p in "db"})
    files["xpooldisk.img"] = pool_mib(ROUNDS)
    return files


def precondition(work: Path) -> None:
    chunk = b"\0" * (1 << 20)
    for name, mib in disk_files().items():
        with open(work / name, "wb") as f:
            for _ in range(mib):
                f.write(chunk)
    os.sync()


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
    kept on, sends each 4 KiB offset exactly once, so every write finds its block unwritten).

    fio fills its buffers with random bytes once (neither server compresses or deduplicates).
    `--refill_buffers` (new random bytes for every write) made fio the bottleneck: 4 GiB of
    1 MiB writes cost fio 4.0 s of CPU (1.2 s without) and capped Strata at ~800 MiB/s, while
    Strata's server spent 2.5 s; without it the same job ran at 1.7-2.1 GB/s."""
    argv = ["fio", "--name=bench", "--ioengine=nbd", f"--uri=nbd+unix:///{export}?socket={sock}",
            f"--rw={rw}", f"--bs={bs}", f"--iodepth={QD}", "--numjobs=1", f"--size={SIZE_MIB}M",
            "--randrepeat=0", "--output-format=json"]
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


def pool_allocated(work: Path, name: str) -> int:
    out = subprocess.run([str(STRATA), "status", "--json", "--data-dir", str(work)], capture_output=True,
                         text=True, check=True).stdout
    pool = next(d for d in json.loads(out)["devices"] if d["kind"] == "thin-pool" and d["name"] == name)
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

    def __init__(self, work: Path, image: Path, flags: list[str] = QEMU_NBD_FLAGS):
        self.sock = work / "qemu.sock"
        self.log = open(work / "qemu-nbd.log", "a")
        self.proc = subprocess.Popen(["qemu-nbd", "-f", "qcow2", "-t", "-e", "4", "-x", "bench", "-k", str(self.sock),
                                      *flags, str(image)], stdout=self.log, stderr=subprocess.STDOUT)
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
    print("writing the disk files end to end", file=sys.stderr)
    precondition(work)
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

        def qemu_job(image: Path, flags: list[str], rw: str, bs: str, seconds: int | None) -> dict:
            nonlocal qemu
            qemu = QemuNbd(work, image, flags)
            try:
                return fio(qemu.sock, "bench", rw, bs, seconds)
            finally:
                qemu.stop()
                qemu = None

        # Precondition: the raw disks, the filled volumes and one qcow2 image written once, end
        # to end, so that the "allocated" rows overwrite allocated space everywhere.
        print("filling raw disks, thin volumes and qcow2 image once", file=sys.stderr)
        for name in ("draw", "braw", "dpool-filled", "bpool-filled"):
            fio(sock, name, "write", "1M", None)
        qcow_filled = new_qcow2(work / "filled.qcow2")
        qemu_job(qcow_filled, QEMU_NBD_FLAGS, "write", "1M", None)
        for name in ("dpool", "bpool"):
            extents = pool_allocated(work, name)
            assert extents == SIZE_MIB * 2**20 // EXTENT, f"fill mapped {extents} extents in {name}"

        for r in range(ROUNDS):
            print(f"round {r + 1}/{ROUNDS}", file=sys.stderr)
            # O_DIRECT: thin against the same stack without thin.
            add("raw rand", fio(sock, "draw", "randwrite", "4k", SECONDS)["iops"])
            add("filled rand", fio(sock, "dpool-filled", "randwrite", "4k", SECONDS)["iops"])
            before = pool_allocated(work, "dpool")
            fresh = fio(sock, f"dpool-fresh{r}", "randwrite", "4k", None)
            add("fresh extents", pool_allocated(work, "dpool") - before)
            add("fresh rand", fresh["iops"])
            add("fresh writes", fresh["ios"])
            add("xfresh rand", fio(sock, f"xpool-fresh{r}", "randwrite", "4k", None)["iops"])
            # The host page cache: thin against qcow2 (and the buffered raw disk).
            add("b raw rand", fio(sock, "braw", "randwrite", "4k", SECONDS)["iops"])
            add("b filled rand", fio(sock, "bpool-filled", "randwrite", "4k", SECONDS)["iops"])
            add("b fresh rand", fio(sock, f"bpool-fresh{r}", "randwrite", "4k", None)["iops"])
            add("b filled seq", fio(sock, "bpool-filled", "write", "1M", SECONDS)["mib_s"])
            add("qcow2 rand", qemu_job(qcow_filled, QEMU_NBD_FLAGS, "randwrite", "4k", SECONDS)["iops"])
            add("qcow2 seq", qemu_job(qcow_filled, QEMU_NBD_FLAGS, "write", "1M", SECONDS)["mib_s"])
            add("qcow2 fresh rand",
                qemu_job(new_qcow2(work / "fresh.qcow2"), QEMU_NBD_FLAGS, "randwrite", "4k", None)["iops"])
            (work / "fresh.qcow2").unlink()
            # O_DIRECT on both sides, for information.
            add("filled seq", fio(sock, "dpool-filled", "write", "1M", SECONDS)["mib_s"])
            add("qcow2 direct rand", qemu_job(qcow_filled, QEMU_DIRECT_FLAGS, "randwrite", "4k", SECONDS)["iops"])
            add("qcow2 direct seq", qemu_job(qcow_filled, QEMU_DIRECT_FLAGS, "write", "1M", SECONDS)["mib_s"])
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
    def line(workload: str, base: str, thin: str, unit: str, target: str = "") -> None:
        print(f"| {workload} | {med[base]:.0f} {unit} | {med[thin]:.0f} {unit} | "
              f"**{med[thin] / med[base]:.2f}x** | {target} |")

    load = os.getloadavg()
    print(f"\nfio nbd engine over a unix socket, one connection, QD{QD}; {ROUNDS} rounds x {SECONDS} s, medians; "
          f"volumes, disks and images {SIZE_MIB} MiB; pool extent {EXTENT // 1024} KiB; load average at the end "
          f"{load[0]:.2f}.\n")
    print("| workload | baseline | Strata thin | ratio | target |")
    print("|---|---:|---:|---:|---|")
    print("| *O_DIRECT file disks, thin vs the raw disk* | | | | |")
    line("4 KiB random write, allocated extents", "raw rand", "filled rand", "IOPS", ">= 0.95x")
    line("4 KiB random write, first writes (fresh volume)", "raw rand", "fresh rand", "IOPS", ">= 0.7x")
    line("4 KiB random write, first writes, `map-commit = \"extent\"` (information)", "raw rand", "xfresh rand",
         "IOPS")
    print(f"| *host page cache, thin vs qemu-nbd qcow2 {' '.join(QEMU_NBD_FLAGS)}* | | | | |")
    line("4 KiB random write, allocated", "qcow2 rand", "b filled rand", "IOPS", ">= 1.5x")
    line("1 MiB sequential write, allocated", "qcow2 seq", "b filled seq", "MiB/s", ">= 1.5x")
    line("4 KiB random write, fresh volume vs new qcow2 image (information)", "qcow2 fresh rand", "b fresh rand",
         "IOPS")
    print("| *host page cache, thin vs the buffered raw disk (information)* | | | | |")
    line("4 KiB random write, allocated extents", "b raw rand", "b filled rand", "IOPS")
    line("4 KiB random write, first writes (commits fdatasync the dirty pages)", "b raw rand", "b fresh rand",
         "IOPS")
    print(f"| *O_DIRECT, thin vs qemu-nbd qcow2 {' '.join(QEMU_DIRECT_FLAGS)} (information)* | | | | |")
    line("4 KiB random write, allocated", "qcow2 direct rand", "filled rand", "IOPS")
    line("1 MiB sequential write, allocated", "qcow2 direct seq", "filled seq", "MiB/s")
    share = med["fresh extents"] / max(1, med["fresh writes"])
    print(f"\nFirst-write rows: {med['fresh writes']:.0f} writes per job, of which {med['fresh extents']:.0f} "
          f"({share:.1%}) allocated a new extent; every write made its 4 KiB granule live (a metadata "
          f"change).")
    print("\nPer round (IOPS or MiB/s): " + "; ".join(
        f"{k} {', '.join(f'{v:.0f}' for v in vs)}" for k, vs in rows.items() if k not in ("fresh writes",)))


if __name__ == "__main__":
    sys.exit(main())
