"""Violin hierarchies through real clients: stacks from the config, online reconfiguration
(grow a slice), hierarchy labels on the member disks and `strata serve --assemble` from the
disks alone (refusing disks of another hierarchy)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from contextlib import contextmanager

import pytest

from harness import (DEFAULT_TCP, MiB, STRATA_BIN, Disk, Export, Layer, ServerSpec, free_port, nbd_handle,
                     on_the_default_port, pattern_bytes, requires_strata, run)

pytestmark = requires_strata()


def strata(*args, check=True, timeout=60) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(STRATA_BIN), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"strata {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def served_size(srv) -> int:
    with nbd_handle(srv) as h:
        return h.get_size()


def status_nodes(srv):
    """Every node of the status's device trees, parents before their children."""
    def walk(node):
        yield node
        for child in node.get("children", []):
            yield from walk(child)
    for root in srv.status()["devices"]:
        yield from walk(root)


def generation(srv) -> int:
    """The hierarchy generation the status reports on the disks under layers."""
    for node in status_nodes(srv):
        detail = dict(node["detail"])
        if "hierarchy generation" in detail:
            return int(detail["hierarchy generation"])
    raise AssertionError("no disk reports a hierarchy generation")


def test_slice_grows_online_and_the_change_survives_a_restart(server_factory):
    spec = ServerSpec(disks=[Disk("d0", 256 * MiB)],
                      layers=[Layer(name="part", kind="slice", children=["d0"], options={"length": "64MiB"})],
                      exports=[Export("vol", "part")])
    srv = server_factory(spec)
    assert served_size(srv) == 64 * MiB
    data = pattern_bytes(11, 4 * MiB)
    with nbd_handle(srv) as h:
        h.pwrite(data, 60 * MiB)
        h.flush()
    before = generation(srv)
    out = strata("grow", "--data-dir", srv.data_dir, "part", "128MiB").stdout
    assert "generation" in out, out
    srv.keep_config = True
    assert served_size(srv) == 128 * MiB
    assert generation(srv) == before + 1
    assert "length = 134217728" in srv.config_path.read_text()
    refused = strata("grow", "--data-dir", srv.data_dir, "part", "1GiB", check=False)
    assert refused.returncode != 0 and "at most" in refused.stderr, refused.stderr
    srv.restart()
    assert served_size(srv) == 128 * MiB
    with nbd_handle(srv) as h:
        assert h.pread(len(data), 60 * MiB) == data
        h.pwrite(data, 124 * MiB)


def test_two_slices_share_one_disk_when_their_ranges_are_disjoint(server_factory):
    """A DAG, not a tree: one disk under two slices that use disjoint halves of it. Each
    export's writes land in its own half (after the 64 KiB label); a grow that would make
    the halves overlap is refused with the ranges named, and nothing changes."""
    half = 32 * MiB
    spec = ServerSpec(disks=[Disk("d0", 64 * MiB + 64 * 1024)],
                      layers=[Layer(name="low", kind="slice", children=["d0"],
                                    options={"offset": 0, "length": "32MiB"}),
                              Layer(name="high", kind="slice", children=["d0"],
                                    options={"offset": "32MiB", "length": "32MiB"})],
                      exports=[Export("low", "low"), Export("high", "high")])
    srv = server_factory(spec)
    low, high = pattern_bytes(21, MiB), pattern_bytes(22, MiB)
    with nbd_handle(srv, export="low") as h:
        assert h.get_size() == half
        h.pwrite(low, 0)
        h.flush()
    with nbd_handle(srv, export="high") as h:
        assert h.get_size() == half
        h.pwrite(high, 0)
        h.flush()
    with nbd_handle(srv, export="low") as h:
        assert h.pread(MiB, 0) == low
    image = srv.data_dir / "disks" / "d0.img"
    with open(image, "rb") as f:
        f.seek(64 * 1024)
        assert f.read(MiB) == low
        f.seek(64 * 1024 + half)
        assert f.read(MiB) == high
    refused = strata("grow", "--data-dir", srv.data_dir, "low", "48MiB", check=False)
    assert refused.returncode != 0, refused.stdout
    assert "overlap" in refused.stderr and "bytes 0B..48MiB" in refused.stderr, refused.stderr
    with nbd_handle(srv, export="low") as h:
        assert h.get_size() == half


def stripe_spec() -> ServerSpec:
    return ServerSpec(disks=[Disk(f"d{i}", 64 * MiB) for i in range(3)],
                      layers=[Layer(name="s", kind="stripe", children=["d0", "d1", "d2"], options={"chunk": "64KiB"})],
                      exports=[Export("vol", "s")])


def assemble(srv, workdir, disks, name="asm", degraded=False, listen=("unix:nbd.sock",)):
    """`strata serve --assemble DISKS`; `degraded`: with members missing that the layer's
    metadata counts as in sync, which a start allows only with --degraded (issue 12).
    `listen`: the --listen addresses, by default the unix socket in its data folder alone (the
    default TCP port is one for the whole machine); None: no --listen."""
    data_dir = workdir / name
    flags = ["--degraded"] if degraded else []
    for addr in listen or ():
        flags += ["--listen", addr]
    proc = subprocess.Popen([str(STRATA_BIN), "serve", "--data-dir", str(data_dir), *flags, "--assemble",
                             *map(str, disks)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, data_dir


def wait_ready(proc, timeout=30):
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("ready:"):
            return "".join(lines)
    proc.kill()
    raise AssertionError(f"not ready: {''.join(lines)}\n{proc.stderr.read()}")


def test_assemble_rebuilds_the_stack_from_its_disks(server_factory, workdir):
    srv = server_factory(stripe_spec())
    data = pattern_bytes(12, 10 * MiB)
    with nbd_handle(srv) as h:
        h.pwrite(data, 3 * MiB)
    srv.stop()
    disks = [srv.disk_file(f"d{i}") for i in range(3)]
    proc, data_dir = assemble(srv, workdir, list(reversed(disks)))  # order does not matter
    try:
        wait_ready(proc)
        uri = f"nbd+unix:///vol?socket={data_dir}/nbd.sock"
        import nbd
        h = nbd.NBD()
        h.connect_uri(uri)
        assert h.get_size() == 3 * (64 * MiB - 64 * 1024) // (64 * 1024) * (64 * 1024)
        assert h.pread(len(data), 3 * MiB) == data
        h.shutdown()
        assert "assembled.toml" in (data_dir / "assembled.toml").name
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def stopped_stripe_with_data(server_factory, seed):
    """A stripe of three disks with 1 MiB of `seed`'s pattern at 0, stopped; returns its disks
    and the data."""
    srv = server_factory(stripe_spec())
    data = pattern_bytes(seed, MiB)
    with nbd_handle(srv) as h:
        h.pwrite(data, 0)
    srv.stop()
    return srv, [srv.disk_file(f"d{i}") for i in range(3)], data


def test_an_assembled_server_listens_where_a_config_without_listen_would(server_factory, workdir):
    """Without --listen, `serve --assemble` serves where a config without `listen` does: the
    unix socket nbd.sock in its data folder and 127.0.0.1:10809 (in a private network
    namespace where possible, since the port is fixed)."""
    srv, disks, data = stopped_stripe_with_data(server_factory, 14)
    data_dir = workdir / "default-listen"
    argv, client = on_the_default_port([STRATA_BIN, "serve", "--data-dir", data_dir, "--assemble", *disks])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = wait_ready(proc)
        assert f"unix:{data_dir}/nbd.sock" in banner and f"tcp:{DEFAULT_TCP}" in banner, banner
        import nbd
        h = nbd.NBD()
        h.connect_uri(f"nbd+unix:///vol?socket={data_dir}/nbd.sock")
        assert h.pread(MiB, 0) == data
        size = h.get_size()
        h.shutdown()
        info = json.loads(run(client(proc.pid, ["nbdinfo", "--json", f"nbd://{DEFAULT_TCP}/vol"])).stdout)
        assert info["exports"][0]["export-size"] == size, info
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_listen_chooses_where_an_assembled_or_configured_server_listens(server_factory, workdir):
    """`--listen ADDR` (repeatable, as the config's `listen` writes them; a relative unix path
    is in the data folder) replaces the listeners an assembled hierarchy or a config has."""
    srv, disks, data = stopped_stripe_with_data(server_factory, 15)
    port = free_port()
    proc, data_dir = assemble(srv, workdir, disks, "chosen", listen=["unix:other.sock", f"tcp:127.0.0.1:{port}"])
    try:
        banner = wait_ready(proc)
        assert f"ready: serving 1 export(s) on unix:{data_dir}/other.sock, tcp:127.0.0.1:{port}" in banner, banner
        assert not (data_dir / "nbd.sock").exists()
        import nbd
        for uri in (f"nbd+unix:///vol?socket={data_dir}/other.sock", f"nbd://127.0.0.1:{port}/vol"):
            h = nbd.NBD()
            h.connect_uri(uri)
            assert h.pread(MiB, 0) == data, uri
            h.shutdown()
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    # The config's listeners (its unix socket) are replaced too.
    sock = workdir / "elsewhere.sock"
    proc = subprocess.Popen([str(STRATA_BIN), "serve", "--config", str(srv.config_path), "--listen", f"unix:{sock}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = wait_ready(proc)
        assert f"ready: serving 1 export(s) on unix:{sock}\n" in banner, banner
        assert not (srv.data_dir / "nbd.sock").exists()
        import nbd
        h = nbd.NBD()
        h.connect_uri(f"nbd+unix:///vol?socket={sock}")
        assert h.pread(MiB, 0) == data
        h.shutdown()
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    # An address the config would refuse is refused, in the same words, before anything starts.
    bad = strata("serve", "--data-dir", workdir / "bad", "--listen", DEFAULT_TCP, "--assemble", *disks, check=False)
    assert bad.returncode != 0 and 'must start with "unix:" or "tcp:"' in bad.stderr, bad.stderr
    assert not (workdir / "bad").exists()


def test_assemble_refuses_foreign_disks_and_missing_members_a_layer_cannot_lose(server_factory, workdir):
    first = server_factory(stripe_spec())
    second = server_factory(stripe_spec())
    first.stop()
    second.stop()
    mixed = [first.disk_file("d0"), first.disk_file("d1"), second.disk_file("d2")]
    proc, _ = assemble(first, workdir, mixed, "mixed")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "refusing to mix" in err, err
    missing = [first.disk_file("d0"), first.disk_file("d1")]
    proc, _ = assemble(first, workdir, missing, "missing")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "d2" in err and "missing" in err, err


@contextmanager
def assembled_vol(srv, workdir, disks, name, degraded=False):
    """`assemble`, connected to export "vol" until the block ends; yields the handle and the
    data dir. The server must then stop cleanly."""
    proc, data_dir = assemble(srv, workdir, disks, name, degraded)
    try:
        wait_ready(proc)
        import nbd
        h = nbd.NBD()
        h.connect_uri(f"nbd+unix:///vol?socket={data_dir}/nbd.sock")
        yield h, data_dir
        h.shutdown()
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def put(h, data: bytes, offset: int, piece: int = 8 * MiB) -> None:
    for at in range(0, len(data), piece):
        h.pwrite(data[at:at + piece], offset + at)


def get(h, length: int, offset: int, piece: int = 8 * MiB) -> bytes:
    return b"".join(h.pread(min(piece, length - at), offset + at) for at in range(0, length, piece))


def layer_node(srv, name) -> dict:
    for node in status_nodes(srv):
        if node["name"] == name:
            return node
    raise AssertionError(f"no node {name} in status")


def wait_idle(srv, name, timeout=60) -> list[float]:
    """Polls until the layer has no activity; returns the progress percentages seen."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = layer_node(srv, name)
        activity = node.get("activity")
        if not activity:
            return seen
        seen.append(100.0 * activity["done_bytes"] / max(1, activity["total_bytes"]))
        time.sleep(0.05)
    raise AssertionError(f"{name} still busy after {timeout} s: {layer_node(srv, name)}")


def test_mirror_member_fails_is_replaced_online_and_the_change_survives(server_factory, workdir):
    spec = ServerSpec(disks=[Disk("d0", 128 * MiB), Disk("d1", 128 * MiB)],
                      layers=[Layer(name="m", kind="mirror", children=["d0", "d1"], options={"region": "4MiB"})],
                      exports=[Export("vol", "m")])
    srv = server_factory(spec)
    data = pattern_bytes(21, 48 * MiB)
    with nbd_handle(srv) as h:
        put(h, data, 0)
        h.flush()
    strata("fail-member", "--data-dir", srv.data_dir, "m", "d1")
    srv.keep_config = True
    assert layer_node(srv, "m")["health"] == "degraded"
    more = pattern_bytes(22, 4 * MiB)
    with nbd_handle(srv) as h:
        h.pwrite(more, 60 * MiB)  # the volume keeps serving on one leg
        assert get(h, len(data), 0) == data
    new_disk = workdir / "d2.img"
    out = strata("replace", "--data-dir", srv.data_dir, "m", "d1", new_disk).stdout
    assert "generation" in out, out
    wait_idle(srv, "m")
    assert layer_node(srv, "m")["health"] == "ok", layer_node(srv, "m")
    config = srv.config_path.read_text()
    assert 'children = ["d0", "d2"]' in config, config
    srv.restart()
    with nbd_handle(srv) as h:
        assert get(h, len(data), 0) == data
        assert h.pread(len(more), 60 * MiB) == more
    srv.stop()
    # The new leg alone carries everything, and the hierarchy from its label.
    with assembled_vol(srv, workdir, [new_disk], "leg", degraded=True) as (h, _):
        assert get(h, len(data), 0) == data
    # The replaced disk left the hierarchy: it may not come back beside the new one.
    proc, _ = assemble(srv, workdir, [srv.disk_file("d0"), srv.disk_file("d1")], "stale")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "left the hierarchy" in err, err


def test_assemble_serves_a_raid5_with_a_member_missing(server_factory, workdir):
    spec = ServerSpec(disks=[Disk(f"d{i}", 64 * MiB) for i in range(3)],
                      layers=[Layer(name="r5", kind="raid5", children=["d0", "d1", "d2"], options={"chunk": "64KiB"})],
                      exports=[Export("vol", "r5")])
    srv = server_factory(spec)
    data = pattern_bytes(31, 24 * MiB)
    with nbd_handle(srv) as h:
        put(h, data, 5 * MiB)
        h.flush()
    srv.stop()
    survivors = [srv.disk_file("d0"), srv.disk_file("d2")]
    with assembled_vol(srv, workdir, survivors, "degraded", degraded=True) as (h, data_dir):
        assert get(h, len(data), 5 * MiB) == data
        status = json.loads(strata("status", "--json", "--data-dir", data_dir).stdout)
        r5 = next(d for d in status["devices"] if d["name"] == "r5")
        assert r5["health"] == "degraded", r5


def test_a_disk_holding_data_is_never_labelled_over(workdir):
    data_dir = workdir / "data"
    data_dir.mkdir()
    (data_dir / "d0.img").write_bytes(b"precious" * (8 * MiB // 8))
    (data_dir / "strata.toml").write_text(
        'listen = ["unix:nbd.sock"]\n[[disk]]\nname = "d0"\npath = "d0.img"\n'
        '[[layer]]\nname = "p"\nkind = "slice"\nchildren = ["d0"]\n[[export]]\nname = "v"\ndevice = "p"\n')
    proc = strata("serve", "--config", data_dir / "strata.toml", check=False, timeout=30)
    assert proc.returncode != 0 and "refusing to overwrite" in proc.stderr, proc.stderr
    assert (data_dir / "d0.img").read_bytes()[:8] == b"precious"


def test_raid5_with_a_journal_device_survives_a_kill_and_assembles_only_with_it(server_factory, workdir):
    spec = ServerSpec(disks=[Disk(f"d{i}", 64 * MiB) for i in range(3)] + [Disk("j", 16 * MiB)],
                      layers=[Layer(name="r5", kind="raid5", children=["d0", "d1", "d2", "j"],
                                    options={"chunk": "64KiB", "journal": "1MiB", "journal-device": "j"})],
                      exports=[Export("vol", "r5")])
    srv = server_factory(spec)
    node = layer_node(srv, "r5")
    assert dict(node["detail"])["journal device"] == "ok", node
    assert len(node["children"]) == 4, node  # three members and the journal device
    data = pattern_bytes(41, 8 * MiB)
    small = [(20 * MiB + i * 12288 + 512, pattern_bytes(100 + i, 4096)) for i in range(64)]
    with nbd_handle(srv) as h:
        put(h, data, 3 * MiB)
        for offset, piece in small:  # read-modify-write updates, journaled on the device
            h.pwrite(piece, offset)
        h.flush()
    srv.crash()
    srv.start()
    with nbd_handle(srv) as h:
        assert get(h, len(data), 3 * MiB) == data
        for offset, piece in small:
            assert h.pread(len(piece), offset) == piece, offset
    srv.stop()
    members = [srv.disk_file(f"d{i}") for i in range(3)]
    proc, _ = assemble(srv, workdir, members, "without-journal")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "journal device is missing" in err, err
    with assembled_vol(srv, workdir, members + [srv.disk_file("j")], "with-journal") as (h, _):
        assert get(h, len(data), 3 * MiB) == data


def test_a_layers_own_verb_is_called_through_a_filter_and_bad_calls_are_refused(server_factory):
    """`strata call`: a verb a kind declares in its registry entry (count's reset-counts)
    reaches the layer from the filter above it; arguments are checked against the declaration;
    verbs that change the graph are sent to their own commands; the server serves on."""
    spec = ServerSpec(disks=[Disk("d0", 64 * MiB)],
                      layers=[Layer(name="counted", kind="count", children=["d0"]),
                              Layer(name="slow", kind="delay", children=["counted"])],
                      exports=[Export("vol", "slow")])
    srv = server_factory(spec)
    data = pattern_bytes(5, 64 * 1024)
    with nbd_handle(srv) as h:
        h.pwrite(data, 0)
        h.pwrite(data, 1 * MiB)
        h.flush()
    answer = json.loads(strata("call", "--data-dir", srv.data_dir, "slow", "reset-counts", "--json").stdout)
    assert answer["writes"] == 2 and answer["bytes written"] == 2 * len(data), answer
    text = strata("call", "--data-dir", srv.data_dir, "counted", "reset-counts").stdout
    assert "writes: 0" in text, text

    def refused(*args) -> str:
        proc = strata("call", "--data-dir", srv.data_dir, *args, check=False)
        assert proc.returncode != 0, proc.stdout
        return proc.stderr

    assert 'has no argument "hard"' in refused("counted", "reset-counts", "hard=1")
    error = refused("slow", "snapshot-create")
    assert 'no verb "snapshot-create"' in error and "its verbs: none" in error, error
    assert "no layer named" in refused("nothing", "reset-counts")
    assert "strata fail-member" in refused("slow", "fail-member", "member=d0")
    with nbd_handle(srv) as h:
        assert h.pread(len(data), 1 * MiB) == data
