#!/usr/bin/python3
"""What consistency intervals cost a client, end to end (issue 19): fio's nbd engine writing
1 MiB sequential blocks, each followed by a flush, through four servers side by side:

- `qemu-nbd` over one raw file: the disk alone, for scale (no mirror, no network hop);
- `strata serve` with a `mirror` over two remote disks, each a `strata serve` brick reached
  over NBD on loopback: RAIN-10's mirroring without intervals (a flush is flushed on both);
- the baseline, "the same RAIN-10 without intervals" of the issue's target: `strata serve`
  with a shared volume over two bricks of its own, written through (`unsafe-without-intervals`,
  `crates/brick/src/volume/through.rs`): each write goes at once to both bricks, durable when
  answered, by the same host code and the same brick service, and a flush has nothing to do;
- `strata serve` with a shared volume over two bricks (`strata brick serve`, one mirror set,
  etcd on loopback): each flush is one interval, prepared and committed on both bricks.

Rows: 1, 4 and 16 fio jobs, each its own NBD connection at queue depth 1 (one write, then its
flush): for the shared volume, 1, 4 and 16 streams of intervals. Every file is on the VM's
disk (BENCH_DIR, /var/tmp by default), so flushes reach it. Medians of BENCH_ROUNDS (default
3) runs of BENCH_SECONDS (default 10); BENCH_JOBS (default 1,4,16) picks the rows. Before the
rounds every device is written whole once (4 writers; BENCH_FILL=0 skips it), so that each is
measured in its steady state; what that first fill took is printed apart.
BENCH_AB_BIN=path adds a second shared volume served by that Strata binary, measured in the
same rounds, and prints the two volumes' ratio round by round: the way to compare two builds
on a VM whose speed drifts between runs. BENCH_MAX_STEAL=N runs a round's row again (up to
BENCH_STEAL_TRIES times, default 3) when the hypervisor took more than N % of the VM's CPU
during any of its runs. BENCH_BRICK_ZERO=1 formats the brick files with `--zero`.

Targets: intervals cost at most 10 % against the same RAIN-10 without them (the baseline);
throughput grows with the number of writers up to 16. The cost against the NBD mirror, a
different implementation of mirroring without intervals, is printed beside it.

A second table gives the mean time of one write and of one flush as fio saw them: where a
writer's time goes (a shared volume answers a write at once and sends it with the flush's
interval; the mirror sends a write to its backs before answering it). A third gives the CPU
each server's processes used per GiB written (user and system,
from /proc/PID/stat, medians over the rounds): qemu-nbd alone; the mirror's front and both
backs; the shared volume's host, both bricks and etcd. On 2 cores, where the busiest rows
keep both cores busy, that is what throughput follows. BENCH_CPU_DETAIL=1 also prints, for
each run, every process's CPU seconds and the bytes it has handed to write calls so far (in
the order: qemu-nbd; back 0, back 1, front; brick 0, brick 1, host, etcd). A last table
reads the shared volumes' bricks' own metrics (`--metrics`): how long a prepare and a commit
took as each brick answered it, how many metadata commits each prepare cost and how long
they took, and how much metadata checkpointing the bricks wrote per GiB. Another gives, run by
run, the share of CPU time the hypervisor stole from the VM (`steal` in /proc/stat): a run
that lost more of it is slower whatever it ran.

BENCH_PERF_DIR=dir records a `perf record` profile of each process of each server for each
run there (`<server>-<writers>-<process>-r<round>.data`, processes in the order above), and
prints the MiB each run wrote, to compare samples per MiB between servers.

Run: bench/shared.sh.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/integration"))
from harness import MiB, STRATA_BIN, Disk, Export, Layer, Server, ServerSpec, free_port, \
    scrape  # noqa: E402

SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
BASE = Path(os.environ.get("BENCH_DIR", "/var/tmp"))
SIZE = 1024 * MiB
JOBS = [int(n) for n in os.environ.get("BENCH_JOBS", "1,4,16").split(",")]
CLUSTER = "bench"
# A second Strata binary (BENCH_AB_BIN) adds a column: its own shared volume, measured in the
# same rounds as the first, so that the VM's drift between runs falls on both alike.
AB_BIN = Path(os.environ["BENCH_AB_BIN"]) if os.environ.get("BENCH_AB_BIN") else None
# The yardstick: the shared volume's own RAIN-10, writing through without intervals.
BASELINE = "same RAIN-10, no intervals"
# BENCH_MAX_STEAL=N (a percentage): a row of a round in which the hypervisor took more than N %
# of the VM's CPU during any server's run is run again, up to BENCH_STEAL_TRIES times in all
# (default 3), the last kept whatever its steal: a run that lost a fifth of the machine is
# slower whatever its code, and pairs of builds are compared round by round.
MAX_STEAL = float(os.environ["BENCH_MAX_STEAL"]) if os.environ.get("BENCH_MAX_STEAL") else None
STEAL_TRIES = int(os.environ.get("BENCH_STEAL_TRIES", "3"))
# BENCH_FILL=0 skips writing every device whole before the rounds.
FILL = os.environ.get("BENCH_FILL", "1") != "0"
# BENCH_BRICK_ZERO=1 formats every brick file with `--zero` (written whole with zeros first).
BRICK_ZERO = os.environ.get("BENCH_BRICK_ZERO", "0") != "0"


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

    def status(self, cluster: str = CLUSTER) -> subprocess.CompletedProcess:
        return subprocess.run([str(STRATA_BIN), "cluster", "status", "--etcd", self.endpoint,
                               "--cluster", cluster], capture_output=True, text=True)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_brick(workdir: Path, name: str, etcd: Etcd, binary: Path = STRATA_BIN,
                cluster: str = CLUSTER) -> tuple[subprocess.Popen, int]:
    """A brick, and the port it serves its metrics on."""
    image = workdir / f"{name}.img"
    run([str(binary), "brick", "format", str(image), "--size", "1216M", "--home", "1G",
         "--meta", "64M", *(["--zero"] if BRICK_ZERO else [])])
    log = open(workdir / f"{name}.log", "wb")
    metrics_port = free_port()
    proc = subprocess.Popen(
        [str(binary), "brick", "serve", str(image), "--listen", f"127.0.0.1:{free_port()}",
         "--etcd", etcd.endpoint, "--cluster", cluster,
         "--metrics", f"127.0.0.1:{metrics_port}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 40
    while f"  {name} (brick)" not in etcd.status(cluster).stdout.split("bricks:")[0]:
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"brick {name} did not join:\n{(workdir / f'{name}.log').read_text()}")
        time.sleep(0.1)
    return proc, metrics_port


def brick_metrics(port: int) -> dict[str, float]:
    """A brick's /metrics, its own `brick` label left out of the series' names."""
    return {re.sub(r'brick="[^"]*",?', "", key).replace("{}", ""): value
            for key, value in scrape(f"http://127.0.0.1:{port}/metrics").items()}


def inside_bricks(before: list[dict[str, float]], after: list[dict[str, float]],
                  written: int) -> dict[str, float]:
    """What the bricks did over one run, both bricks together: mean prepare and commit time
    as each brick answered them, metadata commits per prepare and their mean time, and the
    metadata checkpoints written per GiB of the run."""
    def delta(key: str) -> float:
        return sum(a.get(key, 0.0) - b.get(key, 0.0) for b, a in zip(before, after))

    prepares = delta('strata_brick_rpc_latency_seconds_count{kind="prepare"}') or 1.0
    commits = delta('strata_brick_rpc_latency_seconds_count{kind="commit"}') or 1.0
    directs = delta('strata_brick_rpc_latency_seconds_count{kind="write_direct"}') or 1.0
    meta_commits = delta("strata_brick_meta_commits_total")
    gib = written / (1024 * MiB)
    return {
        # The baseline's bricks take writes through instead of prepares.
        "direct_ms": delta('strata_brick_rpc_latency_seconds_sum{kind="write_direct"}')
        / directs * 1e3,
        "prepare_ms": delta('strata_brick_rpc_latency_seconds_sum{kind="prepare"}') / prepares * 1e3,
        "commit_ms": delta('strata_brick_rpc_latency_seconds_sum{kind="commit"}') / commits * 1e3,
        "meta_commits": meta_commits / prepares,
        "meta_commit_ms": delta("strata_brick_meta_commit_seconds_total") / (meta_commits or 1.0)
        * 1e3,
        "checkpoint_mib": delta("strata_brick_meta_checkpoint_bytes_total") / MiB / gib,
    }


def fio_seen_by_bricks(ports: list[int], pids: list[int], uri: str, jobs: int, workdir: Path,
                       fill: bool = False):
    """`fio`; the CPU seconds each of `pids` used meanwhile; what the bricks serving their
    metrics on `ports` did meanwhile (`inside_bricks`; None without ports); and the share of
    the VM's CPU time its hypervisor took meanwhile (`steal_ticks`). The metrics are read
    outside the CPU's window: serving them is not the writes' cost."""
    before = [brick_metrics(port) for port in ports]
    start = [cpu_seconds([p]) for p in pids]
    ticks = steal_ticks()
    ran = fio(uri, jobs, workdir, fill)
    stolen = steal_share(ticks, steal_ticks())
    used = [cpu_seconds([p]) - s for p, s in zip(pids, start)]
    if not ports:
        return ran, used, None, stolen
    seen = inside_bricks(before, [brick_metrics(port) for port in ports], ran[1])
    return ran, used, seen, stolen


def steal_ticks() -> tuple[int, int]:
    """The machine's stolen and total CPU ticks so far (`steal` in /proc/stat: the VM's CPU
    time its hypervisor gave to others). Time stolen from a run slows it whatever it runs:
    on this VM it moved between 0 and 29 % from one run to the next, the likeliest reason
    whole runs drift by ten to twenty points."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already in user).
    return fields[7], sum(fields[:8])


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    return (after[0] - before[0]) / max(1, after[1] - before[1])


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


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes `pids` have used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def wchar(pid: int) -> int:
    """Bytes the process `pid` has handed to write calls so far (files and sockets)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def fio(uri: str, jobs: int, workdir: Path,
        fill: bool = False) -> tuple[float, int, float, float]:
    """Bytes per second of `jobs` writers, each 1 MiB writes at depth 1 with a flush after
    every write, over its own stretch of the device; the bytes written; and the mean time a
    write and a flush took, in ms (fio's completion latency of the writes, its latency of
    the flushes). With `fill`, each writer writes its stretch once, however long it takes."""
    stretch = SIZE // jobs
    timing = "" if fill else f"runtime={SECONDS}\ntime_based=1\n"
    job = workdir / "job.fio"
    job.write_text(f"[global]\nioengine=nbd\nuri={uri}\nrw=write\nbs=1m\niodepth=1\nfsync=1\n"
                   f"numjobs={jobs}\nsize={stretch}\noffset_increment={stretch}\n"
                   f"{timing}group_reporting=1\n[w]\n")
    r = run(["fio", "--output-format=json", str(job)])
    result = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    assert result["error"] == 0, result
    write = result["write"]
    return (write["io_bytes"] / (write["runtime"] / 1000), write["io_bytes"],
            write["clat_ns"]["mean"] / 1e6, result["sync"]["lat_ns"]["mean"] / 1e6)


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
        uris = {"qemu-nbd, raw file": raw_uri, "mirror of 2 NBD bricks": mirror.uri("vol")}
        pids = {"qemu-nbd, raw file": [qemu.pid],
                "mirror of 2 NBD bricks": [srv.proc.pid for srv in (*backs, mirror)]}
        metrics_ports: dict[str, list[int]] = {}
        # The same RAIN-10 without intervals first: the baseline, the same host code
        # and bricks writing through (`volume/through.rs`).
        volumes = [(BASELINE, STRATA_BIN, f"{CLUSTER}-t", "-t"),
                   ("shared volume, 2 bricks", STRATA_BIN, CLUSTER, "")]
        if AB_BIN is not None:
            volumes.append((f"shared volume, {AB_BIN.name}", AB_BIN, f"{CLUSTER}-b", "-b"))
        for name, binary, cluster, suffix in volumes:
            started = [start_brick(workdir, f"b{i}{suffix}", etcd, binary, cluster)
                       for i in range(2)]
            bricks = [proc for proc, _ in started]
            procs += bricks
            metrics_ports[name] = [port for _, port in started]
            run([str(binary), "cluster", "create-volume", "--etcd", etcd.endpoint, "--cluster",
                 cluster, "v", "--size", "960M", "--mirror", f"b0{suffix},b1{suffix}"])
            shared = Server(workdir / f"host{suffix}", ServerSpec(disks=[Disk(
                name="sv", size=960 * MiB, shared="v", etcd=[etcd.endpoint], cluster=cluster,
                timeout="30s", unsafe_without_intervals=name == BASELINE)], exports=[Export("vol", "sv")]), name=f"host{suffix}",
                binary=binary)
            servers.append(shared.start())
            uris[name] = shared.uri("vol")
            pids[name] = [p.pid for p in bricks] + [shared.proc.pid, etcd.proc.pid]
        # Every device written whole once before the rounds, 4 writers: a fresh shared
        # volume's bricks spent about twice the CPU per byte on its first pass that they
        # spent later (docs/benchmarks.md, run J), and without this the first round measured
        # a first pass on that side only. What the fill took is reported apart.
        fills: dict[str, float] = {}
        # Keyed by the row's writers; 0 is the fill.
        inside: dict[tuple[int, str], list[dict[str, float]]] = {}
        if FILL:
            for name, uri in uris.items():
                ran, _, seen, _ = fio_seen_by_bricks(metrics_ports.get(name, []), pids[name],
                                                     uri, 4, workdir, fill=True)
                fills[name] = ran[0]
                if seen is not None:
                    inside[(0, name)] = [seen]
        results: dict[tuple[int, str], list[float]] = {}
        cpu: dict[tuple[int, str], list[float]] = {}
        latency: dict[tuple[int, str], list[tuple[float, float]]] = {}
        steal: dict[tuple[int, str], list[float]] = {}
        for done in range(ROUNDS):
            # The baseline and the shared volumes take turns going first: the VM's state
            # after one run (its page cache, its host's) falls on each alike.
            order = list(uris)
            if done % 2:
                order[2:] = reversed(order[2:])
            for jobs in JOBS:
                for attempt in range(1, STEAL_TRIES + 1):
                    runs = [measure(name, jobs, done, uris[name], pids[name],
                                    metrics_ports.get(name, []), workdir) for name in order]
                    worst = max(one["stolen"] for one in runs) * 100
                    if MAX_STEAL is None or worst <= MAX_STEAL or attempt == STEAL_TRIES:
                        break
                    print(f"round {done + 1}, {jobs} writers: the hypervisor took up to "
                          f"{worst:.0f} % of the CPU (BENCH_MAX_STEAL={MAX_STEAL:g}); "
                          f"running the round's {jobs}-writer row again", file=sys.stderr)
                if MAX_STEAL is not None and worst > MAX_STEAL:
                    print(f"round {done + 1}, {jobs} writers: kept with up to {worst:.0f} % "
                          f"stolen after {STEAL_TRIES} tries", file=sys.stderr)
                for name, one in zip(order, runs):
                    key = (jobs, name)
                    if one["seen"] is not None:
                        inside.setdefault(key, []).append(one["seen"])
                    results.setdefault(key, []).append(one["rate"])
                    steal.setdefault(key, []).append(one["stolen"])
                    latency.setdefault(key, []).append(one["latency"])
                    cpu.setdefault(key, []).append(one["cpu"])
        report(results, cpu, latency, fills, list(uris))
        report_steal(steal, list(uris))
        report_inside(inside, list(metrics_ports))
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


def measure(name: str, jobs: int, done: int, uri: str, pids: list[int], metrics_ports: list[int],
            workdir: Path) -> dict:
    """One server's run of one row: its rate, fio's latencies, the CPU its processes used per
    GiB, what its bricks' metrics saw, and the share of CPU the hypervisor stole meanwhile."""
    perf = None
    if os.environ.get("BENCH_PERF_DIR"):
        out = Path(os.environ["BENCH_PERF_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        tag = re.sub(r"[^a-z0-9]+", "_", name.lower())
        perf = [subprocess.Popen(
            ["perf", "record", "-q", "-F", "1999", "-p", str(p), "-o",
             str(out / f"{tag}-{jobs}-{k}-r{done}.data")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for k, p in enumerate(pids)]
        time.sleep(0.5)
    (rate, written, write_ms, flush_ms), each, seen, stolen = fio_seen_by_bricks(
        metrics_ports, pids, uri, jobs, workdir)
    for rec in perf or []:
        rec.send_signal(2)
        rec.wait()
    if perf:
        print(f"perf {name} {jobs}: {written // MiB} MiB", file=sys.stderr)
    if os.environ.get("BENCH_CPU_DETAIL"):
        detail = [f"{e:.2f} s, {wchar(p) // MiB} MiB so far" for p, e in zip(pids, each)]
        print(f"{name}, {jobs} writers, {written // MiB} MiB written: " + "; ".join(detail),
              file=sys.stderr)
    return {"rate": rate, "latency": (write_ms, flush_ms), "seen": seen, "stolen": stolen,
            "cpu": sum(each) / (written / (1024 * MiB))}


def report(results: dict[tuple[int, str], list[float]], cpu: dict[tuple[int, str], list[float]],
           latency: dict[tuple[int, str], list[tuple[float, float]]], fills: dict[str, float],
           names: list[str]) -> None:
    shared = names[3:]
    short = [n.removeprefix("shared volume, ") for n in shared]
    costs = " | ".join(f"{s}: cost against the baseline | {s}: against the NBD mirror"
                       for s in short)
    print(f"\n1 MiB sequential writes, a flush after each, fio's nbd engine, files in {BASE} "
          f"(median of {ROUNDS} x {SECONDS} s; MiB/s). The baseline: {BASELINE}, the same "
          "host code and bricks writing through\n")
    print("| writers (connections) | " + " | ".join(names) + f" | {costs} |")
    print("|---:|" + "---:|" * (len(names) + 2 * len(shared)))
    for jobs in JOBS:
        med = [statistics.median(results[(jobs, n)]) / MiB for n in names]
        cost = " | ".join(f"{(med[2] / m - 1) * 100:+.0f} % | {(med[1] / m - 1) * 100:+.0f} %"
                          for m in med[3:])
        print(f"| {jobs} | " + " | ".join(f"{m:.0f}" for m in med) + f" | {cost} |")
    # Paired by round: each round ran the baseline and the shared volumes back to back.
    for other in shared:
        print(f"\n{other} over {names[2]}, per round (MiB/s ratio):")
        for jobs in JOBS:
            ratios = [b / a for a, b in zip(results[(jobs, names[2])], results[(jobs, other)])]
            print(f"  {jobs} writers: " + ", ".join(f"{r:.2f}" for r in ratios)
                  + f" (median {statistics.median(ratios):.2f})")
    if len(shared) == 2:
        print(f"\n{shared[1]} over {shared[0]}, per round (MiB/s ratio):")
        for jobs in JOBS:
            ratios = [b / a for a, b in zip(results[(jobs, shared[0])],
                                            results[(jobs, shared[1])])]
            print(f"  {jobs} writers: " + ", ".join(f"{r:.2f}" for r in ratios)
                  + f" (median {statistics.median(ratios):.2f})")
    if fills:
        print("\nFirst fill, before the rounds: each device written whole once, 4 writers (MiB/s)\n")
        print("| " + " | ".join(names) + " |")
        print("|" + "---:|" * len(names))
        print("| " + " | ".join(f"{fills[n] / MiB:.0f}" for n in names) + " |")
    # Where a writer's time goes: a shared volume answers a write at once and commits it at
    # the flush; the mirror sends the write to its backs before answering, and its flush
    # only syncs them.
    print("\nMean time of one write / one flush as fio saw it, ms (median over the rounds)\n")
    print("| writers (connections) | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for jobs in JOBS:
        cells = []
        for n in names:
            write_ms = statistics.median(w for w, _ in latency[(jobs, n)])
            flush_ms = statistics.median(f for _, f in latency[(jobs, n)])
            cells.append(f"{write_ms:.2f} / {flush_ms:.2f}")
        print(f"| {jobs} | " + " | ".join(cells) + " |")
    print("\nCPU seconds the servers used per GiB written (median over the rounds)\n")
    print("| writers (connections) | " + " | ".join(names) + " | each over the NBD mirror |")
    print("|---:|" + "---:|" * (len(names) + 1))
    for jobs in JOBS:
        med = [statistics.median(cpu[(jobs, n)]) for n in names]
        print(f"| {jobs} | " + " | ".join(f"{m:.2f}" for m in med)
              + " | " + ", ".join(f"{m / med[1]:.2f}" for m in med[2:]) + " |")


def report_steal(steal: dict[tuple[int, str], list[float]], names: list[str]) -> None:
    print("\nCPU time the hypervisor stole from the VM during each run, % (per round, in order)\n")
    print("| writers (connections) | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for jobs in JOBS:
        print(f"| {jobs} | " + " | ".join(
            ", ".join(f"{s * 100:.0f}" for s in steal[(jobs, n)]) for n in names) + " |")


def report_inside(inside: dict[tuple[int, str], list[dict[str, float]]],
                  names: list[str]) -> None:
    """The shared volumes' bricks from their own metrics: of a flush's time, what the
    prepare took inside the bricks, and what their metadata cost."""
    print("\nInside the shared volumes' bricks, from their metrics (both bricks; median over the "
          "rounds; the fill's row is a fresh volume's first pass): mean prepare / commit as the "
          "brick answered it, ms; metadata commits per prepare and their mean, ms; metadata "
          "checkpoints written, MiB per GiB. The baseline's bricks: a write through as they "
          "answered it (written and synced), ms\n")
    print("| writers (connections) | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    # The fill first, when there was one: a fresh volume's first pass.
    for jobs in ([0] if (0, names[0]) in inside else []) + JOBS:
        cells = []
        for n in names:
            runs = inside[(jobs, n)]

            def med(key: str) -> float:
                return statistics.median(r[key] for r in runs)

            if n == BASELINE:
                cells.append(f"write through: {med('direct_ms'):.2f}")
                continue
            cells.append(f"{med('prepare_ms'):.2f} / {med('commit_ms'):.2f}; "
                         f"{med('meta_commits'):.2f} x {med('meta_commit_ms'):.2f}; "
                         f"{med('checkpoint_mib'):.1f}")
        print(f"| {jobs or '4, the fill'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
