#!/usr/bin/python3
"""What consistency intervals cost a client, end to end (issue 19): fio's nbd engine writing
1 MiB sequential blocks, each followed by a flush, through three servers side by side:

- `qemu-nbd` over one raw file: the disk alone, for scale (no mirror, no network hop);
- `strata serve` with a `mirror` over two remote disks, each a `strata serve` brick reached
  over NBD on loopback: RAIN-10's mirroring without intervals (a flush is flushed on both);
- `strata serve` with a shared volume over two bricks (`strata brick serve`, one mirror set,
  etcd on loopback): each flush is one interval, prepared and committed on both bricks.

Rows: 1, 4 and 16 fio jobs, each its own NBD connection at queue depth 1 (one write, then its
flush): for the shared volume, 1, 4 and 16 streams of intervals. Every file is on the VM's
disk (BENCH_DIR, /var/tmp by default), so flushes reach it. Medians of BENCH_ROUNDS (default
3) runs of BENCH_SECONDS (default 10).

Targets: intervals cost at most 10 % against the mirror without them; throughput grows with
the number of writers up to 16.

Run: bench/shared.sh.
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
sys.path.insert(0, str(ROOT / "tests/integration"))
from harness import MiB, STRATA_BIN, Disk, Export, Layer, Server, ServerSpec, free_port  # noqa: E402

SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
BASE = Path(os.environ.get("BENCH_DIR", "/var/tmp"))
SIZE = 1024 * MiB
JOBS = [1, 4, 16]
CLUSTER = "bench"


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return done


class Etcd:
    def __init__(self, workdir: Path):
        client, peer = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{client}"
        self.log = open(workdir / "etcd.log", "wb")
        self.proc = subprocess.Popen(
            ["etcd", "--name", "b", "--data-dir", str(workdir / "etcd"),
             "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"b=http://127.0.0.1:{peer}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 20
        while self.status().returncode != 0:
            if time.monotonic() > deadline:
                sys.exit("etcd did not start")
            time.sleep(0.2)

    def status(self) -> subprocess.CompletedProcess:
        return subprocess.run([str(STRATA_BIN), "cluster", "status", "--etcd", self.endpoint,
                               "--cluster", CLUSTER], capture_output=True, text=True)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_brick(workdir: Path, name: str, etcd: Etcd) -> subprocess.Popen:
    image = workdir / f"{name}.img"
    run([str(STRATA_BIN), "brick", "format", str(image), "--size", "1216M", "--home", "1G",
         "--meta", "64M"])
    log = open(workdir / f"{name}.log", "wb")
    proc = subprocess.Popen(
        [str(STRATA_BIN), "brick", "serve", str(image), "--listen", f"127.0.0.1:{free_port()}",
         "--etcd", etcd.endpoint, "--cluster", CLUSTER],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 40
    while f"  {name} (brick)" not in etcd.status().stdout.split("bricks:")[0]:
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"brick {name} did not join:\n{(workdir / f'{name}.log').read_text()}")
        time.sleep(0.1)
    return proc


def start_qemu_nbd(workdir: Path) -> tuple[subprocess.Popen, str]:
    image = workdir / "raw.img"
    with open(image, "wb") as f:
        f.truncate(SIZE)
    sock = workdir / "qemu.sock"
    proc = subprocess.Popen(["qemu-nbd", "-f", "raw", "--persistent",
                             "-k", str(sock), "-x", "vol", "--shared=32", str(image)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("qemu-nbd did not start")
        time.sleep(0.05)
    return proc, f"nbd+unix:///vol?socket={sock}"


def fio(uri: str, jobs: int, workdir: Path) -> float:
    """Bytes per second of `jobs` writers, each 1 MiB writes at depth 1 with a flush after
    every write, over its own stretch of the device."""
    stretch = SIZE // jobs
    job = workdir / "job.fio"
    job.write_text(f"[global]\nioengine=nbd\nuri={uri}\nrw=write\nbs=1m\niodepth=1\nfsync=1\n"
                   f"numjobs={jobs}\nsize={stretch}\noffset_increment={stretch}\n"
                   f"runtime={SECONDS}\ntime_based=1\ngroup_reporting=1\n[w]\n")
    r = run(["fio", "--output-format=json", str(job)])
    result = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    assert result["error"] == 0, result
    write = result["write"]
    return write["io_bytes"] / (write["runtime"] / 1000)


def main() -> None:
    for tool in ("fio", "etcd", "qemu-nbd"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is needed")
    workdir = Path(tempfile.mkdtemp(prefix="strata-bench-shared-", dir=BASE))
    servers: list[Server] = []
    procs: list[subprocess.Popen] = []
    etcd = None
    try:
        qemu, raw_uri = start_qemu_nbd(workdir)
        procs.append(qemu)
        # The mirror without intervals: two bricks served over NBD, a front mirroring them.
        backs = []
        for i in range(2):
            back = Server(workdir / f"back{i}", ServerSpec(disks=[Disk("d0", SIZE)], tcp=True),
                          name=f"back{i}")
            servers.append(back.start())
            backs.append(back)
        mirror = Server(workdir / "mirror", ServerSpec(
            disks=[Disk(f"r{i}", SIZE, uri=b.tcp_uri("vol"), timeout="30s")
                   for i, b in enumerate(backs)],
            layers=[Layer(name="m", kind="mirror", children=["r0", "r1"])],
            exports=[Export("vol", "m")]), name="mirror")
        servers.append(mirror.start())
        # The shared volume: etcd, two bricks, one mirror set.
        etcd = Etcd(workdir)
        procs += [start_brick(workdir, f"b{i}", etcd) for i in range(2)]
        run([str(STRATA_BIN), "cluster", "create-volume", "--etcd", etcd.endpoint, "--cluster",
             CLUSTER, "v", "--size", "960M", "--mirror", "b0,b1"])
        shared = Server(workdir / "host", ServerSpec(disks=[Disk(
            name="sv", size=960 * MiB, shared="v", etcd=[etcd.endpoint], cluster=CLUSTER,
            timeout="30s")], exports=[Export("vol", "sv")]), name="host")
        servers.append(shared.start())
        uris = {"qemu-nbd, raw file": raw_uri, "mirror of 2 NBD bricks": mirror.uri("vol"),
                "shared volume, 2 bricks": shared.uri("vol")}
        results: dict[tuple[int, str], list[float]] = {}
        for _ in range(ROUNDS):
            for jobs in JOBS:
                for name, uri in uris.items():
                    results.setdefault((jobs, name), []).append(fio(uri, jobs, workdir))
        report(results, list(uris))
    finally:
        # The front first: it holds the backs' connections.
        for srv in reversed(servers):
            try:
                srv.stop()
            except Exception as e:  # a bench reports what it measured; teardown is best effort
                print(f"stopping {srv.workdir}: {e}", file=sys.stderr)
        for proc in procs:
            proc.kill()
            proc.wait()
        if etcd is not None:
            etcd.stop()
        if os.environ.get("BENCH_KEEP"):
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def report(results: dict[tuple[int, str], list[float]], names: list[str]) -> None:
    print(f"\n1 MiB sequential writes, a flush after each, fio's nbd engine, files in {BASE} "
          f"(median of {ROUNDS} x {SECONDS} s; MiB/s)\n")
    print("| writers (connections) | " + " | ".join(names) + " | intervals cost |")
    print("|---:|" + "---:|" * (len(names) + 1))
    for jobs in JOBS:
        med = [statistics.median(results[(jobs, n)]) / MiB for n in names]
        cost = (med[1] / med[2] - 1) * 100
        print(f"| {jobs} | " + " | ".join(f"{m:.0f}" for m in med) + f" | {cost:+.0f} % |")


if __name__ == "__main__":
    main()
