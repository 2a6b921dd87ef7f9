"""Shared volumes across hosts (issue 19, docs/shared-volumes.md): a real etcd, brick processes
(`strata brick serve`) listed in the cluster's catalog, and `strata serve` exporting a shared
volume (`[[disk]] shared = ...`) to clients Strata did not write (qemu-io, fio with verify).
Each client flush is one consistency interval committed on every brick or on none; the tests
check the replicas on the brick files themselves, byte for byte."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import MiB, STRATA_BIN, Disk, Export, Layer, ServerSpec, free_port, nbd_handle, run, \
    scrape
from test_nbd_tools import fio_job

META = 4 * MiB
HOME = 32 * MiB
CLUSTER = "t"
# Short leases keep the waits for a killed process's lease short.
LEASE = "3s"


class Etcd:
    """A single-node etcd on loopback, in its own folder, killed at teardown. With `host`, it
    also listens on that address (`url(host)`), for hosts in network namespaces."""

    def __init__(self, workdir: Path, host: str | None = None):
        client, peer = free_port(), free_port()
        self.port = client
        self.endpoint = f"http://127.0.0.1:{client}"
        self.workdir = workdir
        urls = ",".join([self.endpoint] + ([self.url(host)] if host else []))
        self.argv = ["etcd", "--name", "t", "--data-dir", str(workdir / "etcd"),
                     "--listen-client-urls", urls,
                     "--advertise-client-urls", urls,
                     "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-cluster", f"t=http://127.0.0.1:{peer}"]
        self.start()

    def start(self) -> None:
        self.log = open(self.workdir / "etcd.log", "ab")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 20
        while True:
            done = subprocess.run([str(STRATA_BIN), "cluster", "status", "--etcd", self.endpoint,
                                   "--cluster", CLUSTER], capture_output=True)
            if done.returncode == 0:
                return
            assert self.proc.poll() is None, "etcd exited"
            assert time.monotonic() < deadline, done.stderr.decode()
            time.sleep(0.2)

    def url(self, host: str) -> str:
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


class BrickProc:
    """`strata brick serve` over a brick file, joined to the cluster. It listens on `host`
    (the address the catalog lists), inside network namespace `netns` if given, and reaches
    etcd at `etcd_url` (the etcd's loopback endpoint by default)."""

    def __init__(self, workdir: Path, name: str, etcd: Etcd, host: str = "127.0.0.1",
                 netns: str | None = None, etcd_url: str | None = None):
        self.name, self.etcd = name, etcd
        self.host, self.netns = host, netns
        self.etcd_url = etcd_url or etcd.endpoint
        self.image = workdir / f"{name}.img"
        self.port = free_port()
        # Every brick on the host's loopback serves its metrics (`--metrics`); `metrics()`
        # scrapes them. One inside a network namespace does not: its loopback is its own.
        self.metrics_port = None if netns else free_port()
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        run([str(STRATA_BIN), "brick", "format", str(self.image), "--size", "64M",
             "--home", "32M", "--meta", "4M"])

    def start(self) -> "BrickProc":
        self.log = open(self.log_path, "ab")
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        metrics = ["--metrics", f"127.0.0.1:{self.metrics_port}"] if self.metrics_port else []
        self.proc = subprocess.Popen(
            [*inside, str(STRATA_BIN), "brick", "serve", str(self.image), "--listen",
             f"{self.host}:{self.port}", "--etcd", self.etcd_url, "--cluster", CLUSTER,
             "--lease", LEASE, *metrics],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 40
        while f"  {self.name} (brick)" not in cluster_status(self.etcd).split("bricks:")[0] \
                or "serving brick" not in self.text():
            assert self.proc.poll() is None, self.log_path.read_text()
            assert time.monotonic() < deadline, f"brick {self.name} did not join"
            time.sleep(0.1)
        return self

    def crash(self) -> None:
        """SIGKILL, without waiting for anything else (etcd may be gone too)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        self.log.close()

    def kill(self, sig=signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait()
        self.proc = None
        self.log.close()
        # Its member record goes with its lease; wait for that, so a restart may join again.
        deadline = time.monotonic() + 20
        while f"  {self.name} (brick)" in cluster_status(self.etcd):
            assert time.monotonic() < deadline
            time.sleep(0.2)

    def home(self, version: int | None = None) -> bytes:
        """The brick's share (or a version of it), as its durable metadata says: the map
        sends units anywhere in the brick (docs/brick-format.md), so it is read by `strata
        brick dump`, which opens the brick read-only and may run while it is served."""
        out = self.image.with_suffix(".share")
        args = [str(STRATA_BIN), "brick", "dump", str(self.image), "--output", str(out)]
        if version is not None:
            args += ["--version", str(version)]
        run(args)
        data = out.read_bytes()
        out.unlink()
        assert len(data) == HOME, len(data)
        return data

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """The brick's /metrics, scraped over HTTP: each series (`name{labels}`, with the
        brick's own label left out) to its value."""
        assert self.metrics_port is not None, "a brick in a network namespace"
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics", f'brick="{self.name}"')

    def status(self) -> str:
        return run([str(STRATA_BIN), "brick", "status", f"{self.host}:{self.port}"]).stdout


def cluster_status(etcd: Etcd) -> str:
    return run([str(STRATA_BIN), "cluster", "status", "--etcd", etcd.endpoint,
                "--cluster", CLUSTER]).stdout


@pytest.fixture
def cluster(workdir):
    """etcd, four bricks b0..b3 and a 48 MiB RAIN-10 volume `v` over (b0+b1, b2+b3)."""
    etcd = Etcd(workdir)
    bricks = [BrickProc(workdir, f"b{i}", etcd).start() for i in range(4)]
    run([str(STRATA_BIN), "cluster", "create-volume", "--etcd", etcd.endpoint, "--cluster",
         CLUSTER, "v", "--size", "48M", "--mirror", "b0,b1", "--mirror", "b2,b3"])
    yield etcd, bricks
    for brick in bricks:
        if brick.proc is not None:
            brick.proc.kill()
            brick.proc.wait()
    etcd.stop()


def shared_spec(etcd: Etcd, member: str | None = None) -> ServerSpec:
    disk = Disk(name="sv", size=48 * MiB, shared="v", etcd=[etcd.endpoint], cluster=CLUSTER,
                member=member, timeout="3s", lease=LEASE)
    return ServerSpec(disks=[disk], exports=[Export(name="vol", device="sv")])


def qemu_io(srv, *commands: str, check: bool = True) -> subprocess.CompletedProcess:
    """qemu-io's `commands` against `srv`'s export. When they must succeed, this returns once
    a shared volume's host has landed their intervals (`wait_landed`): its flush returns once
    every brick voted, and the commits go on after, so what the bricks hold or report is
    looked at only then."""
    argv = ["qemu-io", "-f", "raw"]
    for c in commands:
        argv += ["-c", c]
    done = run(argv + [srv.uri()], check=check)
    if check and shared_nodes(srv):
        wait_landed(srv)
    return done


def assert_replicas_equal(bricks) -> None:
    for a, b in [(bricks[0], bricks[1]), (bricks[2], bricks[3])]:
        assert a.home() == b.home(), f"replicas {a.name} and {b.name} differ"


def test_qemu_io_through_a_shared_volume_lands_on_both_copies_and_survives_a_kill(
        cluster, server_factory):
    etcd, bricks = cluster
    srv = server_factory(shared_spec(etcd))
    assert srv.export_size() == 48 * MiB
    # Four stripe units: 0-1 MiB on set 0, 1-2 MiB on set 1, and so on.
    out = qemu_io(srv, "write -P 0x5a 0 4M", "flush", "write -P 0x33 1536k 8k", "flush",
                  "read -P 0x5a 0 1536k", "read -P 0x33 1536k 8k").stdout
    assert "Pattern verification failed" not in out, out
    assert_replicas_equal(bricks)
    # Unit 1 (set 1) starts at offset 0 of b2/b3's home; unit 0 at offset 0 of b0/b1's.
    assert bricks[0].home()[:MiB] == b"\x5a" * MiB
    assert bricks[2].home()[512 * 1024:512 * 1024 + 8192] == b"\x33" * 8192
    # Each interval leaves a tombstone on its bricks; the host has them forgotten every 64,
    # so 150 more intervals leave fewer than 64 behind (a restart of b3 counts them).
    qemu_io(srv, *[f"write -P 0x44 {40 + i % 8}M 4k" for i in range(150)])
    bricks[3].kill()
    bricks[3].start()
    report = re.findall(r"tombstones: (\d+)", bricks[3].text())
    assert report and int(report[-1]) < 64, bricks[3].text()[-2000:]
    print(f"tombstones left on b3 after 152 intervals: {report[-1]}")
    # An unflushed write, then the host dies: what was flushed is intact, the rest is gone
    # everywhere alike.
    qemu_io(srv, "write -P 0x77 2M 1M")
    srv.crash()
    srv2 = server_factory(shared_spec(etcd))
    out = qemu_io(srv2, "read -P 0x5a 0 1536k", "read -P 0x33 1536k 8k").stdout
    assert "Pattern verification failed" not in out, out
    assert_replicas_equal(bricks)


def test_a_brick_away_is_written_around_and_only_what_it_missed_is_copied_back(
        cluster, server_factory):
    etcd, bricks = cluster
    srv = server_factory(shared_spec(etcd))
    # qemu_io returns once the interval landed: b1 killed before it took its commit would
    # miss the 4 MiB interval too (another path, tested in the brick suite), not only what
    # is written while it is away.
    qemu_io(srv, "write -P 0x11 0 4M", "flush")
    bricks[1].kill()
    # Unit 0 is on b0+b1: written on b0 alone, after b1's miss is recorded in etcd.
    out = qemu_io(srv, "write -P 0x22 0 1M", "flush", "read -P 0x22 0 1M").stdout
    assert "Pattern verification failed" not in out, out
    assert "brick down: going on without it" in srv.stderr_text()
    status = cluster_status(etcd)
    assert "brick b1 is stale: 1 regions to copy back" in status
    # The cluster's status asks each brick: b1 does not answer, b0 does.
    assert re.search(r"  b1 at \S+, \d+ bytes: not answering", status), status
    assert re.search(r"  b0 at \S+, \d+ bytes: up, \d+ of \d+ units used", status), status
    assert bricks[0].home()[:MiB] == b"\x22" * MiB
    assert bricks[1].home()[:MiB] == b"\x11" * MiB
    node = shared_node(srv)
    assert node["health"] == "degraded", node
    assert detail(node, "brick b1").startswith("down, 1 regions to copy back"), node
    assert detail(node, "brick b0").startswith("up"), node
    assert detail(node, "segments held").startswith("0 (epoch "), node
    # b1 returns, stale. Another host opening the volume now must never read region 0 from
    # it: four reads, round-robin over the copies, all see the new data.
    bricks[1].start()
    other = server_factory(shared_spec(etcd, member="host-b"))
    out = qemu_io(other, *["read -P 0x22 0 1M"] * 4).stdout
    assert "Pattern verification failed" not in out, out
    other.stop()
    # Once the first host's probe sees b1 answer, its next interval first copies back what
    # b1 missed, and only that.
    deadline = time.monotonic() + 20
    while not re.search(r"brick answers again.*brick=b1", srv.stderr_text()):
        assert time.monotonic() < deadline, srv.stderr_text()[-3000:]
        time.sleep(0.1)
    qemu_io(srv, "write -P 0x33 1M 64k", "flush")
    log = srv.stderr_text()
    assert "copied=1 of=1" in log, log[-3000:]
    status = cluster_status(etcd)
    assert "is stale" not in status
    assert "not answering" not in status, status
    assert_replicas_equal(bricks)
    node = shared_node(srv)
    assert node["health"] == "ok", node
    assert detail(node, "brick b1").startswith("up"), node
    assert detail(node, "regions copied back") == "1", node


def wait_landed(srv, timeout: float = 20) -> None:
    """Waits until the host has no interval in flight: every commit it sent was answered or
    given up on (`strata status`, each shared volume's "intervals")."""
    deadline = time.monotonic() + timeout
    while True:
        intervals = [detail(node, "intervals") for node in shared_nodes(srv)]
        if all(i.endswith(" 0 in flight") for i in intervals):
            return
        assert time.monotonic() < deadline, intervals
        time.sleep(0.05)


def shared_nodes(srv) -> list[dict]:
    """The shared volumes' nodes in `strata status --json`."""
    found = []

    def walk(nodes):
        for n in nodes:
            if n.get("kind") == "shared":
                found.append(n)
            walk(n.get("children") or [])
    walk(srv.status()["devices"])
    return found


def shared_node(srv) -> dict:
    """The shared volume's node in `strata status --json`."""
    found = shared_nodes(srv)
    assert len(found) == 1, found
    return found[0]


def detail(node: dict, key: str) -> str:
    values = [v for k, v in node["detail"] if k == key]
    assert len(values) == 1, (key, node["detail"])
    return values[0]


def test_fio_verifies_through_rain10_while_a_brick_is_killed_and_returns(
        cluster, server_factory, workdir):
    etcd, bricks = cluster
    srv = server_factory(shared_spec(etcd))
    job = fio_job(workdir / "verify.fio", srv, "rain10-verify", rw="randwrite", bs="64k",
                  iodepth=4, size="32m", fsync=8, verify="crc32c", do_verify=1, verify_fatal=1,
                  verify_dump=0)
    fio = subprocess.Popen(["fio", "--output-format=json", str(job)], cwd=workdir,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    bricks[2].kill()
    bricks[2].start()
    out, err = fio.communicate(timeout=300)
    res = json.loads(out[out.index("{"):])
    (j,) = res["jobs"]
    assert j["error"] == 0, (j, err)
    assert j["write"]["io_bytes"] == 32 * MiB and j["read"]["io_bytes"] == 32 * MiB, j
    # b2 is back: once the host's background probe has seen it answer, the next interval
    # first copies back what it missed.
    deadline = time.monotonic() + 20
    while not re.search(r"brick answers again.*brick=b2", srv.stderr_text()):
        assert time.monotonic() < deadline, srv.stderr_text()[-3000:]
        time.sleep(0.1)
    qemu_io(srv, "write -P 0x55 47M 4k", "flush")
    srv.stop()
    log = srv.stderr_text()
    assert ": going on without it" in log and "brick=b2" in log, log[-3000:]
    assert "resync done volume=v brick=b2" in log, log[-3000:]
    assert_replicas_equal(bricks)


def until_landed(brick, offset: int, expected: bytes, within: float = 5.0) -> None:
    """Waits until `brick`'s share holds `expected` at `offset` (read out of band, from its
    file): a commit lands after the flush that reported its interval ended."""
    deadline = time.monotonic() + within
    while (held := brick.home()[offset:offset + len(expected)]) != expected:
        assert time.monotonic() < deadline, f"{brick.name} holds {held[:16]!r}… at {offset}"
        time.sleep(0.05)


def test_each_nbd_connection_is_a_stream_of_intervals_its_flush_commits_only_its_writes(
        cluster, server_factory):
    """Two connections of one client program (libnbd) to the same export: a flush ends the
    interval of its own connection. Unit 0 of the volume is on b0+b1, unit 1 on b2+b3."""
    etcd, bricks = cluster
    srv = server_factory(shared_spec(etcd))
    with nbd_handle(srv) as one, nbd_handle(srv) as two:
        one.pwrite(b"\x71" * 4096, 0)
        two.pwrite(b"\x72" * 4096, MiB)
        two.flush()
        # The flush returns once every brick voted yes; the commits land after it (carried by
        # the next prepare, or sent within 2 ms), and the brick files are read out of band.
        until_landed(bricks[2], 0, b"\x72" * 4096)
        assert bricks[0].home()[:4096] == bytes(4096), "one's write committed by two's flush"
        # Each connection reads its own writes, not the other's before they are committed.
        assert one.pread(4096, 0) == b"\x71" * 4096
        assert two.pread(4096, 0) == bytes(4096)
        assert one.pread(4096, MiB) == b"\x72" * 4096
        one.flush()
        until_landed(bricks[0], 0, b"\x71" * 4096)
        assert two.pread(4096, 0) == b"\x71" * 4096
        # A write left unflushed when its connection ends is committed all the same.
        one.pwrite(b"\x73" * 4096, 2 * MiB)
    deadline = time.monotonic() + 10
    while bricks[0].home()[MiB:MiB + 4096] != b"\x73" * 4096:
        assert time.monotonic() < deadline, srv.stderr_text()[-3000:]
        time.sleep(0.1)
    assert_replicas_equal(bricks)


def test_brick_format_allocates_a_new_file_whole_unless_told_sparse(workdir):
    for name, extra in [("whole", []), ("sparse", ["--sparse"])]:
        image = workdir / f"{name}.img"
        run([str(STRATA_BIN), "brick", "format", str(image), "--size", "64M", "--home", "32M",
             "--meta", "4M", *extra])
        assert image.stat().st_size == 64 * MiB
        allocated = image.stat().st_blocks * 512
        if extra:
            assert allocated < 16 * MiB, allocated
        else:
            assert allocated >= 64 * MiB, allocated
    # An existing file is formatted as it is: nothing allocated behind the operator's back.
    refused = run([str(STRATA_BIN), "brick", "format", str(workdir / "whole.img"), "--home",
                   "32M", "--meta", "4M"], check=False)
    assert refused.returncode != 0 and "refusing to format a brick over it" in refused.stderr


def unwritten_extents(path: Path) -> int | None:
    """How many of the file's extents are unwritten (`filefrag -v`), or None where filefrag
    cannot tell."""
    r = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True)
    if r.returncode != 0 or "logical_offset" not in r.stdout:
        return None
    return sum(1 for line in r.stdout.splitlines() if "unwritten" in line)


def test_brick_format_zero_writes_a_new_file_whole_and_refuses_an_existing_one(workdir):
    """`--zero` writes a new brick file with zeros before the format: no extent is left
    unwritten for the first pass to convert (benchmarks.md, run K), unlike the default
    fallocate. It refuses a file that exists, which it would overwrite, and `--sparse`."""
    zeroed, allocated = workdir / "zeroed.img", workdir / "allocated.img"
    out = run([str(STRATA_BIN), "brick", "format", str(zeroed), "--size", "64M", "--home",
               "32M", "--meta", "4M", "--zero"]).stdout
    assert "home 33554432 bytes" in out, out
    assert zeroed.stat().st_size == 64 * MiB
    assert zeroed.stat().st_blocks * 512 >= 64 * MiB
    run([str(STRATA_BIN), "brick", "format", str(allocated), "--size", "64M", "--home", "32M",
         "--meta", "4M"])
    before = unwritten_extents(allocated)
    if before is not None and before > 0:
        # Where fallocate leaves unwritten extents (ext4, xfs), --zero leaves none.
        assert unwritten_extents(zeroed) == 0, subprocess.run(
            ["filefrag", "-v", str(zeroed)], capture_output=True, text=True).stdout
    # The brick serves as any other: its share reads as zeros.
    share = workdir / "zeroed.share"
    run([str(STRATA_BIN), "brick", "dump", str(zeroed), "--output", str(share)])
    assert share.read_bytes() == bytes(32 * MiB)
    # An existing file is never written with zeros, formatted or not.
    for existing in (zeroed, allocated):
        held = existing.read_bytes()
        refused = run([str(STRATA_BIN), "brick", "format", str(existing), "--size", "64M",
                       "--home", "32M", "--meta", "4M", "--zero", "--force"], check=False)
        assert refused.returncode != 0 and "--zero writes only a file this command creates" \
            in refused.stderr, refused.stderr
        assert existing.read_bytes() == held
    refused = run([str(STRATA_BIN), "brick", "format", str(workdir / "new.img"), "--size", "64M",
                   "--home", "32M", "--zero", "--sparse"], check=False)
    assert refused.returncode != 0 and "cannot be used with" in refused.stderr, refused.stderr
    assert not (workdir / "new.img").exists()


def cluster_cmd(etcd: Etcd, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run([str(STRATA_BIN), "cluster", *args, "--etcd", etcd.endpoint, "--cluster",
                CLUSTER], check=check)


def test_a_dead_brick_is_replaced_and_rebuilt_while_fio_verifies_and_the_copies_end_equal(
        cluster, server_factory, workdir):
    """b1 dies for good (kill -9, as a disk that failed with its brick); the host goes on with
    b0. An administrator formats b4 and serves it, then `strata cluster replace-brick v b1 b4`
    puts it in b1's place and copies it whole from b0 while fio writes and verifies."""
    etcd, bricks = cluster
    srv = server_factory(shared_spec(etcd))
    qemu_io(srv, "write -P 0x61 0 48M", "flush")
    bricks[1].kill()
    qemu_io(srv, "write -P 0x62 0 1M", "flush")
    spare = BrickProc(workdir, "b4", etcd).start()
    # The fixture stops the bricks in its list: without this, b4 outlived the test (found
    # still serving, and retrying etcd, long after a CI run).
    bricks.append(spare)
    # Mistakes are refused, naming why, and change nothing.
    for args, why in [(("b1", "b2"), 'already serves volume "v"'),
                      (("b0", "b4"), 'current only on "b0"'),
                      (("b9", "b4"), "not a brick of the volume")]:
        refused = cluster_cmd(etcd, "replace-brick", "v", *args, check=False)
        assert refused.returncode != 0 and why in refused.stderr, refused.stderr
    assert "brick b1 is stale" in cluster_status(etcd)
    # Held to 8 MiB/s, so that its 4 s of writing overlap the replacement whatever the
    # machine's speed.
    job = fio_job(workdir / "verify.fio", srv, "replace-verify", rw="randwrite", bs="64k",
                  iodepth=4, size="32m", fsync=8, rate="8m", verify="crc32c", do_verify=1,
                  verify_fatal=1, verify_dump=0)
    fio = subprocess.Popen(["fio", "--output-format=json", str(job)], cwd=workdir,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    assert fio.poll() is None, "fio ended before the replacement: nothing overlapped"
    out = cluster_cmd(etcd, "replace-brick", "v", "b1", "b4").stdout
    assert "brick b4 replaces b1; 24 regions to copy to it" in out, out
    done = re.search(r"rebuilt in [\d.]+ s; none missing: (\d+) regions copied here, (\d+) by "
                     r"hosts' flushes", out)
    assert done and int(done[1]) + int(done[2]) == 24, out
    print(done[0])
    out, err = fio.communicate(timeout=300)
    (j,) = json.loads(out[out.index("{"):])["jobs"]
    assert j["error"] == 0, (j, err)
    qemu_io(srv, "write -P 0x63 47M 4k", "flush")
    # fio wrote the first 32 MiB; the rest is as written before b1 died.
    out = qemu_io(srv, "read -P 0x61 32M 15M", "read -P 0x63 47M 4k").stdout
    assert "Pattern verification failed" not in out, out
    status = cluster_status(etcd)
    assert "is stale" not in status and "sets [b0+b4, b2+b3]" in status, status
    srv.stop()
    assert bricks[0].home() == spare.home(), "b0 and its new copy b4 differ"
    assert "brick replaced" in srv.stderr_text()


def test_a_dead_clients_interval_in_doubt_is_resolved_by_the_bricks(cluster, server_factory):
    """kill -9 of the serving host in the middle of a commit: brick b1 is stopped (SIGSTOP), so
    the host's first interval (on b0+b1) waits in a prepare that b0 has already recorded, and
    the host dies there. The bricks hold the interval prepared with no decision; once the
    host's lease runs out they resolve it among themselves, and the replicas end identical."""
    etcd, bricks = cluster
    srv = server_factory(shared_spec(etcd, member="host-a"))
    bricks[1].proc.send_signal(signal.SIGSTOP)
    writer = subprocess.Popen(
        ["qemu-io", "-f", "raw", "-c", "write -P 9 0 1M", "-c", "flush", srv.uri()],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    srv.crash()
    writer.wait()
    bricks[1].proc.send_signal(signal.SIGCONT)
    # The lease runs out, then a resolver pass (every 2 s) settles what is in doubt.
    deadline = time.monotonic() + 40
    while "host-a" in cluster_status(etcd):
        assert time.monotonic() < deadline, "the dead host's lease never ran out"
        time.sleep(0.5)
    time.sleep(5)
    assert_replicas_equal(bricks)
    resolved = sum(b.text().count("interval in doubt resolved") for b in bricks)
    assert resolved >= 1, "no interval was left in doubt: the test did not test resolution\n" + \
        "\n".join(b.text()[-1500:] for b in bricks)
    # The interval was never decided by its host: it is aborted, on both copies. A new host
    # sees one consistent volume, and commits on it.
    srv2 = server_factory(shared_spec(etcd, member="host-b"))
    with nbd_handle(srv2) as h:
        assert h.pread(MiB, 0) == bytes(MiB), "an interval its host never decided is visible"
    qemu_io(srv2, "write -P 0x66 0 64k", "flush")
    assert_replicas_equal(bricks)
    print(f"intervals resolved by the bricks: {resolved}")


def test_a_global_failure_keeps_every_acknowledged_write_and_half_of_none(
        cluster, server_factory):
    """Everything is killed at once (etcd, the bricks, the serving host) in the middle of a
    stream of 64 KiB writes, each its own interval (qemu-io writes through). After a restart:
    every write qemu-io saw acknowledged reads back, the one in flight is all there or not at
    all, and the replicas are identical. (Many small writes, not 160 of 256 KiB: once the
    hosts and bricks sent data by reference, those all ended before the kill.)"""
    etcd, bricks = cluster
    srv = server_factory(shared_spec(etcd, member="host-a"))
    writes, size = 760, 64 * 1024  # the 48 MiB volume holds 768

    def pattern(i: int) -> int:  # a byte per write, never 0 (what an unwritten block reads)
        return i % 250 + 1

    commands = sum([["-c", f"write -P {pattern(i)} {i * 64}k 64k"] for i in range(writes)], [])
    writer = subprocess.Popen(["qemu-io", "-f", "raw", *commands, srv.uri()],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Once the first write is home on b0, let a few more go, then cut everything.
    deadline = time.monotonic() + 20
    while bricks[0].home()[:size] != bytes([1]) * size:
        assert time.monotonic() < deadline and writer.poll() is None, "no write went home"
        time.sleep(0.05)
    time.sleep(0.1)
    etcd.proc.kill()
    for brick in bricks:
        brick.crash()
    srv.crash()
    said, _ = writer.communicate(timeout=60)
    acked = 0
    for line in said.splitlines():
        if line.startswith(f"wrote {size}/{size}"):
            acked += 1
        elif "failed" in line:
            break
    assert 0 < acked < writes, said

    etcd.proc.wait()
    etcd.log.close()
    etcd.start()
    for brick in bricks:
        brick.start()
    # host-a's lease outlives etcd's restart by a TTL; then the bricks settle its interval.
    deadline = time.monotonic() + 60
    while "host-a" in cluster_status(etcd):
        assert time.monotonic() < deadline, "the dead host's lease never ran out"
        time.sleep(0.5)
    time.sleep(5)
    assert_replicas_equal(bricks)
    srv2 = server_factory(shared_spec(etcd, member="host-b"))
    out = qemu_io(srv2, *[f"read -P {pattern(i)} {i * 64}k 64k" for i in range(acked)]).stdout
    assert "Pattern verification failed" not in out, out
    with nbd_handle(srv2) as h:
        flight = h.pread(size, acked * size)
        after = h.pread(size, (acked + 1) * size)
    assert flight in (bytes([pattern(acked)]) * size, bytes(size)), \
        "the write in flight is half there"
    assert after == bytes(size), "a write never sent is there"
    print(f"acknowledged {acked}; the one in flight: {'there' if flight[0] else 'not there'}")


def test_a_host_paused_past_its_lease_is_fenced_when_it_wakes(cluster, server_factory):
    """SIGSTOP of a serving host past its lease: its segment claim goes with the lease, a
    second host takes the segment (a larger epoch) and writes there. When the first wakes up,
    its write is refused (EIO, its log names the lease) and the second host's data stands on
    both copies; the second host goes on writing."""
    etcd, bricks = cluster
    a = server_factory(shared_spec(etcd, member="host-a"))
    qemu_io(a, "write -P 0x61 0 64k", "flush")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 40
        while "host-a" in cluster_status(etcd):
            assert time.monotonic() < deadline, "the paused host's lease never ran out"
            time.sleep(0.3)
        b = server_factory(shared_spec(etcd, member="host-b"))
        qemu_io(b, "write -P 0x62 0 64k", "flush")
    finally:
        a.proc.send_signal(signal.SIGCONT)
    late = qemu_io(a, "write -P 0x63 0 64k", "flush", check=False)
    assert "Input/output error" in late.stdout + late.stderr, late.stdout + late.stderr
    deadline = time.monotonic() + 10
    while "lease ran out" not in a.stderr_text():
        assert time.monotonic() < deadline, a.stderr_text()[-2000:]
        time.sleep(0.2)
    assert bricks[0].home()[:64 * 1024] == b"\x62" * 64 * 1024
    assert_replicas_equal(bricks)
    out = qemu_io(b, "write -P 0x64 0 64k", "flush", "read -P 0x64 0 64k").stdout
    assert "Pattern verification failed" not in out, out
    assert_replicas_equal(bricks)


def version_cmd(etcd: Etcd, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run([str(STRATA_BIN), "cluster", "version", args[0], "--etcd", etcd.endpoint,
                "--cluster", CLUSTER, *args[1:]], check=check)


def test_a_version_taken_while_a_host_serves_is_listed_rolled_back_to_and_deleted(
        cluster, server_factory):
    """Waits on the brick store's versions (docs/brick-format.md): until they land, the
    bricks refuse to seal and the creation fails."""
    etcd, bricks = cluster
    srv = server_factory(shared_spec(etcd))
    qemu_io(srv, "write -P 0x5a 0 4M", "flush")
    # Taken while the host holds its claims: it acknowledges, then the bricks seal.
    out = version_cmd(etcd, "create", "v", "--wait", "20s").stdout
    assert "version 1 complete" in out, out
    qemu_io(srv, "write -P 0x77 0 2M", "flush")
    listed = version_cmd(etcd, "list", "v").stdout
    assert "version counter 1" in listed and "version 1: complete" in listed, listed
    for brick in bricks:
        assert re.search(rf"brick {brick.name}: versions 1 \(\d+ bytes held\)", listed), listed
    # Roll back once no host holds claims. The host stops and leaves the cluster after its
    # last flush: its claims go at once, well before its lease (3 s) would have run out.
    assert srv.stop() == 0
    stopped = time.monotonic()
    while not re.search(r"v: .* 0 of \d+ segments claimed", cluster_status(etcd)):
        assert time.monotonic() - stopped < 1.5, cluster_status(etcd)
        time.sleep(0.1)
    out = version_cmd(etcd, "rollback", "v", "1").stdout
    assert "rolled back to version 1" in out, out
    # Units 0 and 1 start the homes of b0/b1 and b2/b3: both hold 0x5a again.
    assert bricks[0].home()[:2 * MiB] == b"\x5a" * 2 * MiB
    assert bricks[2].home()[:2 * MiB] == b"\x5a" * 2 * MiB
    assert_replicas_equal(bricks)
    srv2 = server_factory(shared_spec(etcd, member="host-after"))
    out = qemu_io(srv2, "read -P 0x5a 0 4M").stdout
    assert "Pattern verification failed" not in out, out
    srv2.stop()
    version_cmd(etcd, "delete", "v", "1")
    listed = version_cmd(etcd, "list", "v").stdout
    assert "version 1:" not in listed, listed
    assert listed.count(": no versions") == 4, listed


def test_a_version_is_refused_while_a_brick_is_down_and_nothing_is_announced(cluster):
    etcd, bricks = cluster
    bricks[3].kill()
    refused = version_cmd(etcd, "create", "v", check=False)
    assert refused.returncode != 0
    assert "needs every brick" in refused.stderr and "b3" in refused.stderr, refused.stderr
    assert "version counter 0" in version_cmd(etcd, "list", "v").stdout


def test_versions_taken_on_a_schedule_keep_only_the_newest_and_stop_between_two_on_sigterm(
        cluster, server_factory):
    """`version create --every 1s --keep 2`: a version a second while a host writes, the
    oldest deleted beyond the newest two, on every brick too; SIGTERM ends it between two
    versions, never inside one. `--keep 0` is refused before anything is taken."""
    etcd, bricks = cluster
    srv = server_factory(shared_spec(etcd))
    qemu_io(srv, "write -P 0x11 0 4M", "flush")
    refused = version_cmd(etcd, "create", "v", "--keep", "0", check=False)
    assert refused.returncode != 0 and "keep at least 1" in refused.stderr, refused.stderr
    assert "version counter 0" in version_cmd(etcd, "list", "v").stdout
    taker = subprocess.Popen(
        [str(STRATA_BIN), "cluster", "version", "create", "--etcd", etcd.endpoint,
         "--cluster", CLUSTER, "v", "--every", "1s", "--keep", "2", "--wait", "20s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        pattern = 0x20
        # Each round's writes are old data to the version after: the versions hold some.
        while not re.search(r"version 4: complete", listed := version_cmd(etcd, "list", "v").stdout):
            assert time.monotonic() < deadline and taker.poll() is None, listed
            qemu_io(srv, f"write -P {pattern:#x} 0 1M", "flush")
            pattern += 1
            time.sleep(0.2)
    finally:
        taker.send_signal(signal.SIGTERM)
        out, err = taker.communicate(timeout=40)
    assert taker.returncode == 0, (out, err)
    assert "stopped taking versions" in out, out
    taken = [int(n) for n in re.findall(r"version (\d+) complete", out)]
    deleted = [int(n) for n in re.findall(r"version (\d+) deleted \(keeping the newest 2\)", out)]
    assert len(taken) >= 4 and taken == list(range(1, len(taken) + 1)), out
    # Every version but the newest two was deleted, oldest first, each once it fell out.
    assert deleted == list(range(1, len(taken) - 1)), out
    listed = version_cmd(etcd, "list", "v").stdout
    newest = taken[-2:]
    complete = sorted(int(n) for n in re.findall(r"version (\d+): complete", listed))
    assert complete == newest, listed
    assert "being taken" not in listed and "failed" not in listed, listed
    for brick in bricks:
        assert re.search(rf"brick {brick.name}: versions {newest[0]} \(\d+ bytes held\), "
                         rf"{newest[1]} \(\d+ bytes held\)", listed), listed
    assert srv.stop() == 0
    assert_replicas_equal(bricks)
    # With a brick down every taking is refused: each refusal is reported, the schedule goes
    # on, and nothing kept is deleted.
    bricks[3].kill()
    taker = subprocess.Popen(
        [str(STRATA_BIN), "cluster", "version", "create", "--etcd", etcd.endpoint,
         "--cluster", CLUSTER, "v", "--every", "1s", "--keep", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.5)
    taker.send_signal(signal.SIGTERM)
    out, err = taker.communicate(timeout=40)
    assert taker.returncode == 0, (out, err)
    assert "complete" not in out and "deleted" not in out, out
    assert err.count("scheduled version not taken") >= 2 and "needs every brick" in err, err
    listed = version_cmd(etcd, "list", "v").stdout
    assert sorted(int(n) for n in re.findall(r"version (\d+): complete", listed)) == newest, listed


def test_a_brick_reports_its_calls_space_versions_and_roll_back_in_metrics_and_status(
        cluster, server_factory):
    etcd, bricks = cluster
    b0 = bricks[0]
    before = b0.metrics()
    assert before["strata_brick_format"] == 3
    assert before["strata_brick_share_bytes"] == HOME
    assert before["strata_brick_units_kept"] == 0
    assert 'strata_brick_rpcs_total{kind="prepare"}' not in before, before
    srv = server_factory(shared_spec(etcd))
    # Units 0 and 2 of the volume (1 MiB each) are set 0's: 2 MiB prepared on b0, then read.
    out = qemu_io(srv, "write -P 0x5a 0 4M", "flush", "read -P 0x5a 0 1M").stdout
    assert "Pattern verification failed" not in out, out
    after = b0.metrics()
    prepares = after['strata_brick_rpcs_total{kind="prepare"}']
    assert prepares >= 1, after
    assert after['strata_brick_rpc_latency_seconds_count{kind="prepare"}'] == prepares
    assert after['strata_brick_rpcs_total{kind="commit"}'] >= 1, after
    assert after['strata_brick_rpc_bytes_total{kind="prepare"}'] == 2 * MiB, after
    assert after["strata_brick_intervals_in_doubt"] == 0
    assert after["strata_brick_units_away"] == 2 * MiB // 4096
    assert after["strata_brick_meta_commits_total"] > before["strata_brick_meta_commits_total"]
    assert after["strata_brick_meta_journal_blocks_total"] \
        > before["strata_brick_meta_journal_blocks_total"]
    # 4 MiB written cannot fill a journal: no checkpoint since the brick's open.
    assert after["strata_brick_meta_checkpoints_total"] \
        == before["strata_brick_meta_checkpoints_total"]
    assert after["strata_brick_meta_checkpoint_bytes_total"] \
        == before["strata_brick_meta_checkpoint_bytes_total"]
    # The host reads a replica of its choice: b0 or b1 served the MiB.
    read = sum(b.metrics().get('strata_brick_rpc_bytes_total{kind="read"}', 0)
               for b in bricks[:2])
    assert read >= MiB, read
    status = b0.status()
    assert f"format 3, share {HOME} bytes" in status, status
    assert "versions: none;" in status and "intervals in doubt: 0" in status, status
    print(status)

    # A version, 1 MiB overwritten after it on b0 (256 units kept), then a roll-back to it.
    assert "version 1 complete" in version_cmd(etcd, "create", "v", "--wait", "20s").stdout
    qemu_io(srv, "write -P 0x77 0 2M", "flush")
    assert b0.metrics()["strata_brick_units_kept"] == 256
    status = b0.status()
    assert "versions: 1 (sealed, 1048576 bytes held); newest created 1, newest sealed 1" \
        in status, status
    srv.stop()
    deadline = time.monotonic() + 20
    while not re.search(r"v: .* 0 of \d+ segments claimed", cluster_status(etcd)):
        assert time.monotonic() < deadline, cluster_status(etcd)
        time.sleep(0.2)
    assert "rolled back to version 1" in version_cmd(etcd, "rollback", "v", "1").stdout
    rolled = b0.metrics()
    step = '{step="rollback",version="1"}'
    assert rolled["strata_brick_step_entries_done" + step] == 256, rolled
    assert rolled["strata_brick_step_entries" + step] == 256, rolled
    assert rolled["strata_brick_step_running" + step] == 0, rolled
    assert rolled['strata_brick_rpcs_total{kind="rollback"}'] == 1, rolled
    assert rolled["strata_brick_units_kept"] == 0
    status = b0.status()
    assert "last: roll-back to version 1, ended, 256 of 256 entries" in status, status
    print(status)


# A lock-aware client: reads the counter at OFFSET of the export at URI, adds one, writes it
# back and flushes (its NBD connection's writes are committed by its flush, before `strata
# lock` unlocks).
INCREMENT = """
import sys, nbd
uri, offset, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
h = nbd.NBD()
h.connect_uri(uri)
count = int.from_bytes(h.pread(512, offset)[:8], "little")
record = (count + 1).to_bytes(8, "little") + tag.encode()
h.pwrite(record.ljust(512, b"\\0"), offset)
h.flush()
h.shutdown()
"""

SLICE_AT = 2 * MiB
# The hierarchy label the stack keeps at the start of a layer's member (hierarchy.rs).
LABEL = 64 * 1024


def locking_spec(etcd: Etcd, member: str) -> ServerSpec:
    """The shared volume under a slice (its range moved by SLICE_AT on the way down), and a
    plain file disk beside it that holds no locks."""
    shared = Disk(name="sv", size=48 * MiB, shared="v", etcd=[etcd.endpoint], cluster=CLUSTER,
                  member=member, timeout="10s", lease=LEASE)
    plain = Disk(name="plain", size=8 * MiB)
    part = Layer(name="part", kind="slice", children=["sv"],
                 options={"offset": "2MiB", "length": "32MiB"})
    return ServerSpec(disks=[shared, plain], layers=[part],
                      exports=[Export(name="vol", device="part"), Export(name="plain", device="plain")])


def strata_lock(srv, export: str, offset: int, length: int, *command: str,
                check: bool = True) -> subprocess.CompletedProcess:
    return run([str(STRATA_BIN), "lock", "--admin", srv.admin_sock, export, str(offset),
                str(length), "--", *command], check=check)


def test_lock_aware_clients_on_two_hosts_increment_counters_through_a_slice_and_lose_none(
        cluster, server_factory):
    """Lock verbs for NBD clients (`strata lock`, a lock session on the admin socket): on
    each of two hosts, two libnbd clients increment two counters, each under an exclusive
    lock taken through the slice over the shared volume. Every increment is there."""
    import threading

    etcd, bricks = cluster
    hosts = [server_factory(locking_spec(etcd, f"h{i}")) for i in range(2)]
    # On the volume, below the slice (2 MiB) and the label (64 KiB): one counter in lock
    # segment 0 (4 MiB each), one whose 1 MiB lock reaches from 11.6 MiB over the boundary
    # of segments 2 and 3, so the lock claims both.
    counters = [MiB, 9 * MiB + 512 * 1024]
    rounds = 6
    failures: list[str] = []

    def worker(h: int, w: int) -> None:
        srv = hosts[h]
        for r in range(rounds):
            for c in range(len(counters)):
                at = counters[(c + w) % len(counters)]
                done = strata_lock(srv, "vol", at, MiB, sys.executable, "-c", INCREMENT,
                                   srv.uri("vol"), str(at), f"h{h} w{w} r{r}", check=False)
                if done.returncode != 0:
                    failures.append(f"h{h} w{w} r{r}: {done.stderr[-2000:]}")
                    return

    threads = [threading.Thread(target=worker, args=(h, w)) for h in range(2) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    total = 2 * 2 * rounds
    for at in counters:
        for srv in hosts:
            with nbd_handle(srv, export="vol") as vol:
                count = int.from_bytes(vol.pread(512, at)[:8], "little")
            assert count == total, f"counter at {at} of the slice reads {count} on {srv.workdir}"
        # On the bricks: below the slice, the volume starts with the hierarchy's 64 KiB label
        # (the stack slices it off too, and locks are moved past it alike); the volume's
        # 1 MiB stripe units alternate over the two mirror sets.
        unit, within = divmod(LABEL + SLICE_AT + at, MiB)
        home_at = (unit // 2) * MiB + within
        held = bricks[2 * (unit % 2)].home()[home_at:home_at + 8]
        assert int.from_bytes(held, "little") == total, (at, home_at)
    assert_replicas_equal(bricks)


def test_strata_lock_refuses_what_holds_no_locks_and_a_dead_clients_lock_is_released(
        cluster, server_factory):
    etcd, _ = cluster
    srv = server_factory(locking_spec(etcd, "h0"))
    # A plain file disk holds no locks: refused, naming what does, and the command not run.
    marker = srv.workdir / "ran"
    refused = strata_lock(srv, "plain", 0, 4096, "touch", str(marker), check=False)
    assert refused.returncode != 0
    assert "does not carry range locks" in refused.stderr, refused.stderr
    assert not marker.exists(), "the command ran without its lock"
    unknown = strata_lock(srv, "nosuch", 0, 4096, "true", check=False)
    assert unknown.returncode != 0 and "no export" in unknown.stderr, unknown.stderr
    past = strata_lock(srv, "vol", 32 * MiB - 512, 4096, "true", check=False)
    assert past.returncode != 0 and "past the end" in past.stderr, past.stderr
    # The command's exit status is strata lock's.
    assert strata_lock(srv, "vol", 0, 4096, "sh", "-c", "exit 7", check=False).returncode == 7
    # A holder killed while it holds its lock: its session's connection closes and the server
    # releases the lock, so the next holder gets it at once.
    holder = subprocess.Popen([str(STRATA_BIN), "lock", "--admin", srv.admin_sock, "vol", "0",
                               "4096", "--", "sleep", "60"], start_new_session=True)
    try:
        time.sleep(1.0)
        assert holder.poll() is None, "the first holder did not get its lock"
        waiting = subprocess.Popen([str(STRATA_BIN), "lock", "--admin", srv.admin_sock, "vol",
                                    "2048", "512", "--", "true"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(1.0)
        assert waiting.poll() is None, "a second holder was granted a range held exclusively"
        import os
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        started = time.monotonic()
        out, err = waiting.communicate(timeout=8)
        assert waiting.returncode == 0, err
        print(f"lock granted {time.monotonic() - started:.2f} s after its holder was killed")
    finally:
        if holder.poll() is None:
            import os
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
