"""Remote disks (bricks, docs/remote-disks.md): a `[[disk]]` with `uri =` served by qemu-nbd
over a file, by nbdkit's memory plugin, and by another `strata serve`. Clients Strata did not
write (qemu-io, fio's nbd engine with verify) write through the front server, and the data is
checked on the brick itself, not through Strata. A brick that is down at start is a missing
disk named by its URI; a brick that restarts under a running server is reconnected to."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness import MiB, Disk, Export, Layer, ServerSpec, run
from test_hierarchy import layer_node, status_nodes
from test_nbd_tools import fio_job

BRICK = 64 * MiB


def wait_socket(path: Path, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return
        assert proc.poll() is None, f"brick exited {proc.returncode}"
        time.sleep(0.02)
    raise AssertionError(f"{path} did not appear within {timeout} s")


class Brick:
    """An NBD server Strata did not write, on a unix socket, stopped at teardown."""

    def __init__(self, argv: list[str], sock: Path, export: str):
        self.argv, self.sock, self.export = argv, sock, export
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Brick":
        if self.sock.exists():
            self.sock.unlink()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        wait_socket(self.sock, self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)

    @property
    def uri(self) -> str:
        return f"nbd+unix:///{self.export}?socket={self.sock}"


@pytest.fixture
def bricks():
    """Bricks stopped at teardown. Ask for it before `server_factory`: fixtures are torn down
    last-first, so the front servers stop (with their final flush) while the bricks still run."""
    started: list[Brick] = []

    def start(argv, sock, export) -> Brick:
        brick = Brick(argv, sock, export).start()
        started.append(brick)
        return brick

    yield start
    for brick in started:
        brick.stop()


def qemu_nbd_brick(bricks, workdir: Path) -> tuple[Brick, Path]:
    image = workdir / "brick.img"
    run(["qemu-img", "create", "-q", "-f", "raw", str(image), str(BRICK)])
    sock = workdir / "qemu.sock"
    argv = ["qemu-nbd", "-f", "raw", "-k", str(sock), "-x", "brick", "-t", "--cache=none", str(image)]
    return bricks(argv, sock, "brick"), image


def front_spec(uri: str, size: int = BRICK, **disk) -> ServerSpec:
    return ServerSpec(disks=[Disk("b0", size, uri=uri, **disk)], exports=[Export("vol", "b0")])


def remote_node(srv) -> dict:
    (node,) = [n for n in status_nodes(srv) if n["kind"] == "remote"]
    return node


def test_writes_through_strata_land_on_a_qemu_nbd_brick(bricks, server_factory, workdir):
    brick, image = qemu_nbd_brick(bricks, workdir)
    front = server_factory(front_spec(brick.uri))
    run(["qemu-io", "-f", "raw", "-c", "write -P 0xab 0 1M", "-c", "write -P 0xcd 40M 512k",
         "-c", "flush", front.uri()])
    with open(image, "rb") as f:
        assert f.read(MiB) == b"\xab" * MiB
        f.seek(40 * MiB)
        assert f.read(512 * 1024) == b"\xcd" * (512 * 1024)
        f.seek(MiB)
        assert f.read(MiB) == bytes(MiB), "bytes never written are zeros on the brick"
    # The whole export, read through Strata, is the brick's file.
    run(["qemu-img", "compare", "-f", "raw", "-F", "raw", str(image), front.uri()])
    node = remote_node(front)
    detail = dict(node["detail"])
    assert detail["uri"] == brick.uri and detail["connection"] == "connected", node
    assert detail["connections"] == "1"
    assert node["size"] == BRICK


def test_fio_verifies_through_strata_onto_an_nbdkit_memory_brick(bricks, server_factory, workdir):
    sock = workdir / "nbdkit.sock"
    brick = bricks(["nbdkit", "-f", "-U", str(sock), "memory", str(BRICK)], sock, "")
    assert "can_multi_conn: true" in run(["nbdinfo", brick.uri]).stdout
    front = server_factory(front_spec(brick.uri, connections=4))
    # nbdkit's memory plugin advertises multi-conn: the four connections are made.
    assert dict(remote_node(front)["detail"])["connections"] == "4"
    job = fio_job(workdir / "verify.fio", front, "remote-verify", rw="randwrite", bs="4k",
                  iodepth=16, size="16m", verify="crc32c", do_verify=1, verify_fatal=1,
                  verify_dump=0)
    r = run(["fio", "--output-format=json", str(job)], timeout=300, cwd=workdir)
    assert '"error" : 0' in r.stdout, r.stdout[-3000:]
    # What fio wrote is on the brick: Strata's view and the brick's own are the same bytes,
    # and they are not all zeros.
    run(["qemu-img", "compare", "-f", "raw", "-F", "raw", brick.uri, front.uri()])
    nonzero = run(["qemu-img", "map", "--output=json", "-f", "raw", brick.uri]).stdout
    assert '"data": true' in nonzero, nonzero


def test_a_strata_brick_behind_a_strata_front(server_factory, workdir):
    brick = server_factory()  # one 256 MiB file disk d0 exported as `vol`
    front = server_factory(front_spec(brick.uri(), 256 * MiB, timeout="5s"))
    run(["qemu-io", "-f", "raw", "-c", "write -P 0x5a 4M 2M", "-c", "flush", front.uri()])
    with open(brick.disk_file("d0"), "rb") as f:
        f.seek(4 * MiB)
        assert f.read(2 * MiB) == b"\x5a" * (2 * MiB)
    run(["qemu-img", "compare", "-f", "raw", "-F", "raw", str(brick.disk_file("d0")), front.uri()])
    assert dict(remote_node(front)["detail"])["timeout"] == "5s"
    # The front first: its final flush needs the brick.
    assert front.stop() == 0


def test_a_brick_down_at_start_is_a_missing_disk_named_by_its_uri(server_factory, workdir):
    uri = f"nbd+unix:///vol?socket={workdir}/nobody.sock"
    spec = ServerSpec(disks=[Disk("b0", BRICK, uri=uri), Disk("d1", 16 * MiB)],
                      exports=[Export("vol", "b0"), Export("plain", "d1")])
    front = server_factory(spec)
    err = front.stderr_text()
    assert "disk b0" in err and uri in err, err[-3000:]
    # The rest serves; the remote export does not exist (never an empty stand-in).
    run(["qemu-io", "-f", "raw", "-c", "write -P 1 0 4k", front.uri("plain")])
    r = run(["qemu-io", "-f", "raw", "-c", "read 0 4k", front.uri("vol")], check=False)
    assert r.returncode != 0


def test_a_restarted_brick_is_reconnected_to(bricks, server_factory, workdir):
    brick, image = qemu_nbd_brick(bricks, workdir)
    front = server_factory(front_spec(brick.uri, timeout="20s"))
    run(["qemu-io", "-f", "raw", "-c", "write -P 0x11 0 64k", "-c", "flush", front.uri()])
    brick.proc.send_signal(signal.SIGKILL)
    brick.proc.wait()
    # The front notices on its next request; meanwhile the brick comes back.
    brick.start()
    run(["qemu-io", "-f", "raw", "-c", "write -P 0x22 1M 64k", "-c", "flush", front.uri()], timeout=60)
    with open(image, "rb") as f:
        assert f.read(64 * 1024) == b"\x11" * 65536
        f.seek(MiB)
        assert f.read(64 * 1024) == b"\x22" * 65536
    assert dict(remote_node(front)["detail"])["connection"] == "connected"


def test_a_mirror_over_two_bricks_survives_one_host_going_away(server_factory, workdir):
    """Two `strata serve` bricks, a front mirroring across them. One brick is killed
    outright (SIGKILL, as a host that loses power): the mirror fails that member, keeps
    serving from the other, and fio's verify finds every block it wrote; status names the
    dead brick."""
    bricks = [server_factory(), server_factory()]
    uris = [b.uri() for b in bricks]
    spec = ServerSpec(disks=[Disk("b0", 256 * MiB, uri=uris[0], timeout="5s"),
                             Disk("b1", 256 * MiB, uri=uris[1], timeout="5s")],
                      layers=[Layer(name="m", kind="mirror", children=["b0", "b1"],
                                    options={"region": "4MiB"})],
                      exports=[Export("vol", "m")])
    front = server_factory(spec)
    write = fio_job(workdir / "write.fio", front, "before", rw="randwrite", bs="4k", iodepth=16,
                    size="32m", verify="crc32c", do_verify=0, verify_dump=0)
    run(["fio", str(write)], timeout=300, cwd=workdir)
    run(["qemu-io", "-f", "raw", "-c", "flush", front.uri()])
    bricks[1].crash()
    # Requests go on: the first to reach the dead brick fails that member, not the client.
    more = fio_job(workdir / "more.fio", front, "after", rw="randwrite", bs="64k", iodepth=8,
                   offset="64m", size="32m", verify="crc32c", do_verify=1, verify_fatal=1,
                   verify_dump=0)
    r = run(["fio", "--output-format=json", str(more)], timeout=300, cwd=workdir)
    assert '"error" : 0' in r.stdout, r.stdout[-3000:]
    check = fio_job(workdir / "check.fio", front, "before", rw="randwrite", bs="4k", size="32m",
                    verify="crc32c", verify_only=1, verify_fatal=1, verify_dump=0)
    r = run(["fio", "--output-format=json", str(check)], timeout=300, cwd=workdir)
    assert '"error" : 0' in r.stdout, r.stdout[-3000:]
    assert layer_node(front, "m")["health"] == "degraded", layer_node(front, "m")
    dead = [n for n in status_nodes(front) if n["kind"] == "remote" and uris[1] in n["name"]]
    assert dead and dead[0]["health"] == "failed", dead
    assert front.stop() == 0


def test_a_brick_on_another_host_behind_the_papers_9ms_round_trip(server_factory):
    """A brick in its own network namespace (a host of its own, reached over veth), and a
    `delay` with the migration paper's 9 ms round trip in front of it: data crosses, and
    every request pays the round trip."""
    from netns import hosts
    with hosts(1) as [(ns, address)]:
        brick = server_factory(ServerSpec(tcp=True, unix=False, netns=ns, host=address))
        spec = ServerSpec(disks=[Disk("b0", 256 * MiB, uri=brick.tcp_uri(), timeout="10s")],
                          layers=[Layer(name="far", kind="delay", children=["b0"],
                                        options={"rtt": "9ms", "seed": 3})],
                          exports=[Export("vol", "far")])
        front = server_factory(spec)
        run(["qemu-io", "-f", "raw", "-c", "write -P 0x42 0 1M", "-c", "flush", front.uri()])
        with open(brick.disk_file("d0"), "rb") as f:
            # The front's hierarchy label comes first on its member disk, then the data.
            head = f.read(4 * MiB)
        assert head.startswith(b"STRATAHL") and b"\x42" * MiB in head
        started = time.monotonic()
        reads = 40
        run(["qemu-io", "-f", "raw", *sum((["-c", f"read -P 0x42 {i * 4096} 4k"]
                                           for i in range(reads)), []), front.uri()])
        per_read_ms = (time.monotonic() - started) * 1000 / reads
        assert 6.0 < per_read_ms < 30.0, f"{per_read_ms:.1f} ms per read"
        (node,) = [n for n in status_nodes(front) if n["kind"] == "delay"]
        assert dict(node["detail"])["rtt"] == "9 ms avg, 2.3 ms deviation", node
        assert front.stop() == 0
        assert brick.stop() == 0
