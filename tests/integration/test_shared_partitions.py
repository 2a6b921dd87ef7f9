"""Shared volumes under network partitions (issue 19, docs/shared-volumes.md): hosts and bricks
in network namespaces (netns.py) whose links are cut with `ip link set DEV down`. This kernel
has no netem: a link down on one side black-holes what the other side sends (no reset, no
unreachable error), as a pulled cable or a dead switch port would.

The root namespace gets an address of its own on `lo` (10.78.T.1/32). etcd and the bricks
that stay in the root namespace listen there, and every namespace routes to it through its
veth, so cutting one namespace's link cuts that namespace off and nothing else."""

from __future__ import annotations

import contextlib
import hashlib
import random
import re
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness import MiB, STRATA_BIN, Disk, Export, ServerSpec, block_device, mounted, \
    assert_fsck_clean, nbd_handle, run
from netns import address_lock, hosts
from test_ext4 import _can_do_block_devices
from test_shared import CLUSTER, LEASE, BrickProc, Etcd, assert_replicas_equal, \
    cluster, cluster_status, qemu_io  # noqa: F401 (cluster is a fixture)

SEG = 4 * MiB  # the volumes' lock segment (the catalog's default)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@contextlib.contextmanager
def root_address():
    """An address of the root namespace that the namespaces reach through their veths."""
    with address_lock():
        taken = ip("-o", "addr", "show").stdout
        for _ in range(50):
            addr = f"10.78.{random.randrange(1, 250)}.1"
            if f"{addr}/" not in taken:
                break
        ip("addr", "add", f"{addr}/32", "dev", "lo")
    try:
        yield addr
    finally:
        ip("addr", "del", f"{addr}/32", "dev", "lo", check=False)


class Net:
    """One namespace of netns.hosts(): `ns`, its address, the root side's address, and the
    veth's two ends."""

    def __init__(self, ns: str, address: str):
        self.ns, self.address = ns, address
        self.gateway = address.rsplit(".", 1)[0] + ".1"
        self.root_dev = ip("-o", "addr", "show", "to", self.gateway).stdout.split()[1]
        links = ip("netns", "exec", ns, "ip", "-o", "link", "show").stdout.splitlines()
        self.dev = next(line.split(":")[1].strip().split("@")[0] for line in links
                        if line.split(":")[1].strip() != "lo")
        self.route()

    def route(self) -> None:
        ip("netns", "exec", self.ns, "ip", "route", "replace", "default", "via", self.gateway)

    def cut_root_side(self) -> None:
        """What the namespace sends is black-holed (its routes stay; the cable is dead)."""
        ip("link", "set", self.root_dev, "down")

    def cut_inside(self) -> None:
        """What the root namespace sends to the namespace is black-holed."""
        ip("netns", "exec", self.ns, "ip", "link", "set", self.dev, "down")

    def heal(self) -> None:
        ip("link", "set", self.root_dev, "up")
        ip("netns", "exec", self.ns, "ip", "link", "set", self.dev, "up")
        self.route()  # a link down drops the default route with it


@contextlib.contextmanager
def net_pool(workdir: Path, namespaces: int, volumes, in_namespace: dict[str, int] | None = None):
    """etcd and four bricks b0..b3 listening on the root namespace's own address (a brick named
    in `in_namespace` runs in that namespace instead, on its address), `namespaces` namespaces
    routed to it, and `volumes`: (name, size, mirror sets). Yields (etcd, bricks, nets, addr)."""
    in_namespace = in_namespace or {}
    with root_address() as addr, hosts(namespaces) as made:
        nets = [Net(ns, a) for ns, a in made]
        etcd = Etcd(workdir, host=addr)
        bricks = []
        try:
            for i in range(4):
                name = f"b{i}"
                if name in in_namespace:
                    net = nets[in_namespace[name]]
                    brick = BrickProc(workdir, name, etcd, host=net.address, netns=net.ns,
                                      etcd_url=etcd.url(addr))
                else:
                    brick = BrickProc(workdir, name, etcd, host=addr)
                bricks.append(brick.start())
            for name, size, sets in volumes:
                mirrors = sum([["--mirror", s] for s in sets], [])
                run([str(STRATA_BIN), "cluster", "create-volume", "--etcd", etcd.endpoint,
                     "--cluster", CLUSTER, name, "--size", size, *mirrors])
            yield etcd, bricks, nets, addr
        finally:
            for net in nets:
                with contextlib.suppress(Exception):
                    net.heal()
            for brick in bricks:
                if brick.proc is not None:
                    brick.proc.kill()
                    brick.proc.wait()
            etcd.stop()


def spec(etcd_url: str, member: str, volume: str = "v", size: int = 48 * MiB,
         netns: str | None = None, lease: str = LEASE) -> ServerSpec:
    disk = Disk(name="sv", size=size, shared=volume, etcd=[etcd_url], cluster=CLUSTER,
                member=member, timeout="3s", lease=lease)
    return ServerSpec(disks=[disk], exports=[Export(name="vol", device="sv")], netns=netns)


def attempt(h, data: bytes, offset: int) -> tuple[bool, float, str]:
    """A write and a flush through libnbd: (acknowledged, seconds, error)."""
    import nbd

    started = time.monotonic()
    try:
        h.pwrite(data, offset)
        h.flush()
        return True, time.monotonic() - started, ""
    except nbd.Error as e:
        return False, time.monotonic() - started, str(e)


def wait_for(what: str, condition, timeout: float, pause: float = 0.2) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout}s"
        time.sleep(pause)
    return time.monotonic() - started


def member_listed(etcd: Etcd, name: str) -> bool:
    return f"  {name} (client)" in cluster_status(etcd)


def test_a_host_cut_off_from_everything_is_fenced_and_another_takes_over(
        workdir, server_factory):
    """Host A, in a namespace, writes segment 0 and then its link goes down (everything it
    sends is lost). Its flush fails with EIO within seconds instead of hanging; its lease runs
    out; host B takes the segment and writes. With the link back, A is refused (fenced, its
    log says the lease ran out), B's data stands on both copies, and A's write that was
    acknowledged before the cut (in a segment B never touched) is there. A's write whose
    flush failed is never written: A refuses it again when it stops."""
    with net_pool(workdir, 1, [("v", "48M", ["b0,b1", "b2,b3"])]) as (etcd, bricks, nets, addr):
        (net,) = nets
        a = server_factory(spec(etcd.url(addr), "host-a", netns=net.ns))
        with nbd_handle(a) as h:
            ok, _, why = attempt(h, b"\x41" * 65536, 8 * MiB)
            assert ok, why
            for k in range(5):  # A streams into segment 0, keeping its claim
                ok, _, why = attempt(h, bytes([0x50 + k]) * 65536, 0)
                assert ok, why
            net.cut_root_side()
            cut = time.monotonic()
            ok, took, why = attempt(h, b"\x42" * 65536, 0)
            assert not ok and "Input/output error" in why, why
            # The etcd read before the interval waits no longer than the lease has left.
            lease = float(LEASE.rstrip("s"))
            assert took < lease + 1.5, f"the cut host's flush took {took:.1f}s to fail"
            print(f"cut host: flush failed (EIO) after {took:.1f}s")
            # etcd drops A's lease (3 s) and its claims with it.
            wait_for("host A's lease to run out in etcd",
                     lambda: not member_listed(etcd, "host-a"), 20)
            print(f"host A's lease gone in etcd {time.monotonic() - cut:.1f}s after the cut")
            b = server_factory(spec(etcd.endpoint, "host-b"))
            out = qemu_io(b, "write -P 0x62 0 64k", "flush", "read -P 0x62 0 64k").stdout
            assert "Pattern verification failed" not in out, out
            took_over = time.monotonic() - cut
            net.heal()
            # Back on the network, A learns its lease is gone and is refused for good.
            wait_for("host A to learn it is fenced",
                     lambda: "lease ran out: fenced" in a.stderr_text(), 15)
            for _ in range(2):
                ok, _, why = attempt(h, b"\x43" * 65536, 0)
                assert not ok and "Input/output error" in why, why
        # A still buffers the write whose flush failed: stopping, it says it could not be
        # flushed (a non-zero exit) rather than dropping it or writing it.
        rc = a.stop()
        assert rc != 0 and "final flush failed" in a.stderr_text(), (rc, a.stderr_text()[-2000:])
        assert "lease ran out" in a.stderr_text()
        print(f"host B wrote segment 0 {took_over:.1f}s after the cut")
        out = qemu_io(b, "read -P 0x62 0 64k", "read -P 0x41 8M 64k").stdout
        assert "Pattern verification failed" not in out, out
        assert bricks[0].home()[:65536] == b"\x62" * 65536
        assert bricks[1].home()[:65536] == b"\x62" * 65536
        assert_replicas_equal(bricks)


class Proxy:
    """A TCP proxy to etcd, in threads, that can black-hole either direction: while a
    direction is held nothing is read from its source, so bytes wait in the kernel (as a
    partition's retransmissions would) and flow again when it heals."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.up_held = threading.Event()    # host -> etcd
        self.down_held = threading.Event()  # etcd -> host
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.closed = False
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                conn.close()
                continue
            self.sockets += [conn, upstream]
            threading.Thread(target=self._pump, args=(conn, upstream, self.up_held),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, conn, self.down_held),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, held: threading.Event) -> None:
        import select

        try:
            while not self.closed:
                if held.is_set():
                    time.sleep(0.02)
                    continue
                ready, _, _ = select.select([src], [], [], 0.1)
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                while held.is_set() and not self.closed:
                    time.sleep(0.02)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


def test_a_host_cut_off_from_etcd_only_stops_committing_and_recovers_only_within_its_lease(
        cluster, server_factory):
    """The minority side: host A reaches the bricks but etcd only through a proxy.
    1. etcd's answers are held (A's renewals still reach etcd, so its lease lives there): A's
       session lapses, its flushes fail (EIO) naming the lease. Healed, A commits again.
    2. Both directions held past the lease: etcd drops A's lease, host B takes segment 0 and
       writes. Healed, A stays fenced.
    No write A was told was flushed is lost."""
    etcd, bricks = cluster
    proxy = Proxy(int(etcd.endpoint.rsplit(":", 1)[1]))
    try:
        a = server_factory(spec(proxy.url, "host-a"))
        acked: dict[int, int] = {}  # offset -> the last pattern A's flush acknowledged
        k = 0

        def write(h, offsets=(0, 16 * MiB)):
            nonlocal k
            k += 1
            results = [attempt(h, bytes([k]) * 65536, off) for off in offsets]
            if all(ok for ok, _, _ in results):
                acked.update({off: k for off in offsets})
            return results[0]

        with nbd_handle(a) as h:
            for _ in range(5):
                ok, _, why = write(h)
                assert ok, why
            # 1. Answers from etcd held.
            proxy.down_held.set()
            held = time.monotonic()
            failed_at = None
            lease = float(LEASE.rstrip("s"))
            while time.monotonic() - held < 12:
                ok, took, why = write(h, offsets=(0,))
                # No answer from etcd since `held`: the lease cannot be known past
                # held + lease, and nothing may commit after that (a prepare sent just before
                # may finish a little later).
                assert not ok or time.monotonic() - held < lease + 0.5, \
                    f"A committed {time.monotonic() - held:.1f}s after etcd fell silent"
                if not ok:
                    failed_at = time.monotonic() - held
                    assert "Input/output error" in why, why
                    break
                time.sleep(0.1)
            assert failed_at is not None, "A went on committing with etcd silent"
            # The refusal names the lease (the commit's or the claim's wording).
            assert "lease ran out or" in a.stderr_text(), a.stderr_text()[-3000:]
            # A refuses at once now; etcd still has its lease (the renewals got there).
            ok, took, why = write(h, offsets=(0,))
            assert not ok and took < 1, (ok, took, why)
            assert member_listed(etcd, "host-a")
            proxy.down_held.clear()
            healed = time.monotonic()
            back = None
            while time.monotonic() - healed < 15:
                ok, _, _ = write(h)
                if ok:
                    back = time.monotonic() - healed
                    break
                time.sleep(0.2)
            assert back is not None, "A did not commit again after etcd came back in time"
            print(f"etcd answers held: A's flush failed {failed_at:.1f}s in; "
                  f"healed, it committed again {back:.1f}s later")
            last = acked[16 * MiB]
            # 2. Both directions held, past the lease in etcd.
            proxy.up_held.set()
            proxy.down_held.set()
            cut = time.monotonic()
            wait_for("A's lease to run out in etcd", lambda: not member_listed(etcd, "host-a"), 20)
            gone = time.monotonic() - cut
            b = server_factory(spec(etcd.endpoint, "host-b"))
            done = qemu_io(b, "write -P 0xbb 0 64k", "flush")
            assert "failed" not in done.stdout + done.stderr, done.stdout + done.stderr
            proxy.up_held.clear()
            proxy.down_held.clear()
            wait_for("A to learn it is fenced",
                     lambda: "lease ran out: fenced" in a.stderr_text(), 15)
            for _ in range(3):
                ok, _, why = write(h)
                assert not ok and "Input/output error" in why, why
                time.sleep(0.3)
            print(f"both directions held: lease gone in etcd after {gone:.1f}s; "
                  "A stays fenced after healing")
        # Every write A was told was flushed is there, but where B wrote after it.
        assert acked[16 * MiB] == last
        out = qemu_io(b, "read -P 0xbb 0 64k", f"read -P {last} 16M 64k").stdout
        assert "Pattern verification failed" not in out, out
        assert bricks[0].home()[:65536] == b"\xbb" * 65536
        assert_replicas_equal(bricks)
    finally:
        proxy.close()


def test_a_black_holed_brick_costs_the_flushes_nothing_and_gets_back_what_it_missed(
        workdir, server_factory):
    """Brick b1 runs in a namespace whose link goes down (not killed: its packets are lost).
    The host's call to it times out (3 s): the commit of the last interval, still on its way
    (a flush returns at the last yes vote), or the next prepare. b1 is taken down and its
    missed region recorded stale, and the host goes on writing on b0 alone. Flushes while b1 is away must cost about
    what healthy ones cost: b1 is probed in the background, not by each flush. With the link
    back, b1 gets back exactly the region it missed, and the replicas are equal."""
    with net_pool(workdir, 1, [("v", "48M", ["b0,b1", "b2,b3"])],
                  in_namespace={"b1": 0}) as (etcd, bricks, nets, addr):
        (net,) = nets
        srv = server_factory(spec(etcd.endpoint, "host-a"))
        with nbd_handle(srv) as h:
            ok, _, why = attempt(h, b"\x10" * MiB, 0)  # region 0 of b0/b1, whole
            assert ok, why
            healthy = []
            for k in range(20):
                ok, took, why = attempt(h, bytes([0x20 + k]) * 65536, 0)
                assert ok, why
                healthy.append(took)
            net.cut_inside()
            ok, first, why = attempt(h, b"\x30" * 65536, 0)
            assert ok, f"the host did not write around the black-holed brick: {why}"
            degraded = []
            for k in range(20):
                ok, took, why = attempt(h, bytes([0x40 + k]) * 65536, 0)
                assert ok, why
                degraded.append(took)
            report = (f"flush latency: healthy median {statistics.median(healthy) * 1000:.0f} ms; "
                      f"first flush after the cut {first:.1f}s; while b1 is black-holed median "
                      f"{statistics.median(degraded) * 1000:.0f} ms, max {max(degraded) * 1000:.0f}"
                      f" ms, 20 flushes in {sum(degraded):.1f}s")
            print(report)
            assert re.search(r"(brick down|brick did not acknowledge a commit): going on "
                             r"without it volume=v brick=b1", srv.stderr_text())
            assert "brick b1 is stale: 1 regions to copy back" in cluster_status(etcd)
            assert statistics.median(degraded) < 0.5, report
            assert sum(degraded) < 10, report
            net.heal()
            healed = time.monotonic()

            def copied_back():
                ok, _, why = attempt(h, b"\x77" * 65536, 0)  # the region b1 missed
                assert ok, why
                return "resync done volume=v brick=b1" in srv.stderr_text()
            took = wait_for("b1 to be copied back", copied_back, 20, pause=0.3)
            print(f"b1 copied back {took:.1f}s after its link came back")
        log = srv.stderr_text()
        assert "copied=1 of=1" in log, log[-3000:]
        assert "is stale" not in cluster_status(etcd)
        assert bricks[1].home()[:65536] == b"\x77" * 65536
        assert bricks[1].home()[65536:MiB] == b"\x10" * (MiB - 65536)
        assert_replicas_equal(bricks)
        # Its lease ran out while it was cut off: back on the network, it joins again.
        wait_for("b1 to join the cluster again",
                 lambda: "joined the cluster again" in bricks[1].text()
                 and "  b1 (brick)" in cluster_status(etcd), 20, pause=0.3)


def make_files(root: Path, seed: int, n: int = 24) -> dict[str, str]:
    rng = random.Random(seed)
    sums = {}
    for i in range(n):
        big = rng.randrange(1, 900 * 1024)
        data = rng.randbytes(rng.choice([1, 4096, 5000, big, big, big]))
        (root / f"f{i:02d}.bin").write_bytes(data)
        sums[f"f{i:02d}.bin"] = hashlib.sha256(data).hexdigest()
    return sums


def digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.glob("f*.bin")}


@pytest.mark.skipif(_can_do_block_devices() is not None, reason=str(_can_do_block_devices()))
def test_two_hosts_in_namespaces_each_mount_ext4_on_its_own_volume_of_one_pool(
        workdir, server_factory):
    """One pool of four bricks, two volumes (v1 mirrored on b0+b1, v2 on b2+b3). Host A in one
    namespace serves v1, host B in another serves v2; each volume carries an ext4 (nbdfuse and
    a loop device), both mounted at once, written with files, unmounted, checked by
    `e2fsck -fn`, remounted and verified. The replicas are equal on the brick files."""
    volumes = [("v1", "32M", ["b0,b1"]), ("v2", "32M", ["b2,b3"])]
    with net_pool(workdir, 2, volumes) as (etcd, bricks, nets, addr):
        servers = [server_factory(spec(etcd.url(addr), f"host-{i}", volume=f"v{i + 1}",
                                       size=32 * MiB, netns=net.ns))
                   for i, net in enumerate(nets)]
        with contextlib.ExitStack() as stack:
            devs = [stack.enter_context(block_device(srv, workdir, f"h{i}"))
                    for i, srv in enumerate(servers)]
            mnts = [workdir / f"mnt{i}" for i in range(2)]
            for dev in devs:
                run(["mkfs.ext4", "-q", "-F", dev], timeout=120)
            want = []
            with mounted(devs[0], mnts[0]), mounted(devs[1], mnts[1]):
                for i, mnt in enumerate(mnts):
                    want.append(make_files(mnt, seed=i))
                run(["sync"])
            for i, dev in enumerate(devs):
                assert_fsck_clean(dev, f"volume v{i + 1}")
            for i, (dev, mnt) in enumerate(zip(devs, mnts)):
                with mounted(dev, mnt, "ro"):
                    assert digests(mnt) == want[i]
        for i, srv in enumerate(servers):
            assert "shared volume opened" in srv.stderr_text(), srv.stderr_text()[-2000:]
        # Each volume is its set's: ext4's magic at 1080 in the first brick of each.
        assert bricks[0].home()[1080:1082] == b"\x53\xef"
        assert bricks[2].home()[1080:1082] == b"\x53\xef"
        assert_replicas_equal(bricks)
