"""Thin volumes managed while serving (`strata volume create|list|resize|delete`), through
real clients: a new volume is exported at once, resizes show on the next connection, shrinks
and deletes give their extents back, everything survives a restart and a kill -9, and bad
requests get a precise refusal while the server keeps serving."""

from __future__ import annotations

import json
import subprocess

import nbd
import pytest

from harness import (admin_command, admin_refused, MiB, GiB, STRATA_BIN, Disk, Export, Layer, ServerSpec, Volume, nbd_handle, pattern_bytes,
                     requires_strata, run)

pytestmark = requires_strata()

EXTENT = 64 * 1024


def spec() -> ServerSpec:
    """A 128 MiB pool with two volumes in the config: `base` (kept) and `old` (deleted by
    some tests), each with an export of its own name."""
    return ServerSpec(
        disks=[Disk("d0", 128 * MiB)],
        layers=[Layer(extent=EXTENT, volumes=[Volume("base", 64 * MiB), Volume("old", 64 * MiB)])],
        exports=[Export("base", "pool/base"), Export("old", "pool/old")],
    )


def volume(srv, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return admin_command(srv, "volume", *args, check=check)


def refused(srv, *args: str) -> str:
    return admin_refused(srv, "volume", *args)


def listing(srv) -> dict:
    pools = json.loads(volume(srv, "list", "--json").stdout)
    assert [p["pool"] for p in pools] == ["pool"]
    return pools[0]


def row(srv, name: str) -> dict | None:
    return next((v for v in listing(srv)["volumes"] if v["volume"] == name), None)


def export_size(srv, export: str) -> int:
    info = json.loads(run(["nbdinfo", "--json", srv.uri(export)]).stdout)
    return info["exports"][0]["export-size"]


def exports(srv) -> list[str]:
    return [e["name"] for e in srv.status()["exports"]]


def test_create_write_list_resize_and_delete(server_factory):
    srv = server_factory(spec())
    config_before = srv.config_path.read_text()
    out = volume(srv, "create", "pool/v1", "--size", "1GiB").stdout
    assert 'exported as "pool/v1"' in out, out
    assert srv.config_path.read_text() == config_before, "create needs no config edit"

    # Exported at once: qemu-io writes, nbdinfo sees the size, libnbd reads back.
    assert export_size(srv, "pool/v1") == 1 * GiB
    run(["qemu-io", "-f", "raw", "-c", "write -P 0xab 0 1M", srv.uri("pool/v1")])
    far = pattern_bytes(11, 4 * MiB)
    with nbd_handle(srv, export="pool/v1") as h:
        assert h.pread(MiB, 0) == b"\xab" * MiB
        h.pwrite(far, 900 * MiB)
        h.flush()

    pool = listing(srv)
    v1 = row(srv, "v1")
    assert v1["size"] == 1 * GiB and v1["allocated_bytes"] == 5 * MiB and v1["exports"] == ["pool/v1"], v1
    assert pool["allocated_bytes"] == 5 * MiB
    assert pool["volume_bytes"] == 1 * GiB + 128 * MiB
    assert abs(pool["overcommit"] - pool["volume_bytes"] / pool["data_bytes"]) < 1e-9
    assert pool["overcommit"] > 8, "1152 MiB of volumes on a 128 MiB disk"
    text = volume(srv, "list").stdout
    assert "over-commit" in text and "pool/v1" in text, text

    # Grow: a client connected before keeps its size; a new connection sees the new one.
    early = srv.connect(export="pool/v1")
    out = volume(srv, "resize", "pool/v1", "--size", "2GiB").stdout
    assert "from 1GiB to 2GiB" in out and "1 connected client(s) keep seeing 1GiB" in out, out
    assert early.get_size() == 1 * GiB, "NBD has no resize notification"
    early.shutdown()
    assert export_size(srv, "pool/v1") == 2 * GiB
    with nbd_handle(srv, export="pool/v1") as h:
        assert h.get_size() == 2 * GiB
        assert h.pread(len(far), 900 * MiB) == far, "data intact after a grow"
        assert h.pread(MiB, 1536 * MiB) == bytes(MiB), "the new space reads as zeros"
        h.pwrite(b"\x77" * EXTENT, 1536 * MiB)
        h.flush()
    assert row(srv, "v1")["allocated_bytes"] == 5 * MiB + EXTENT

    # Shrink: refused without --shrink; then data past the end is gone and its extents freed.
    assert "pass --shrink to confirm" in refused(srv, "resize", "pool/v1", "--size", "512MiB")
    assert row(srv, "v1")["size"] == 2 * GiB
    holder = srv.connect(export="pool/v1")
    volume(srv, "resize", "pool/v1", "--size", "512MiB", "--shrink")
    assert row(srv, "v1")["allocated_bytes"] == 1 * MiB
    assert listing(srv)["allocated_bytes"] == 1 * MiB
    # The client connected before the shrink still believes 2 GiB but is refused past 512 MiB.
    with pytest.raises(nbd.Error) as refusal:
        holder.pwrite(b"\x55" * 4096, 900 * MiB)
    assert refusal.value.errnum == 28 or "past the end" in str(refusal.value), refusal.value  # ENOSPC
    holder.shutdown()
    assert listing(srv)["allocated_bytes"] == 1 * MiB, "nothing mapped past the end"
    assert export_size(srv, "pool/v1") == 512 * MiB
    volume(srv, "resize", "pool/v1", "--size", "1GiB")
    with nbd_handle(srv, export="pool/v1") as h:
        assert h.pread(MiB, 0) == b"\xab" * MiB
        assert h.pread(len(far), 900 * MiB) == bytes(len(far)), "cut-off data came back after a grow"

    # Delete: refused while a client is connected, then frees every extent and the export.
    with nbd_handle(srv, export="pool/v1") as h:
        err = refused(srv, "delete", "pool/v1")
        assert "pool/v1 is in use" in err and '1 on export "pool/v1"' in err and "--force" in err, err
        assert h.pread(MiB, 0) == b"\xab" * MiB, "the refused delete left the client alone"
    out = volume(srv, "delete", "pool/v1").stdout
    assert 'export "pool/v1" removed' in out, out
    assert row(srv, "v1") is None
    assert listing(srv)["allocated_bytes"] == 0
    assert "pool/v1" not in exports(srv)
    r = run(["nbdinfo", srv.uri("pool/v1")], check=False)
    assert r.returncode != 0, "the export is gone"
    assert srv.config_path.read_text() == config_before, "v1 was never in the config"


def test_force_delete_closes_the_clients_connection(server_factory):
    srv = server_factory(spec())
    volume(srv, "create", "pool/busy", "--size", "256MiB")
    h = srv.connect(export="pool/busy")
    h.pwrite(pattern_bytes(5, MiB), 0)
    h.flush()
    out = volume(srv, "delete", "pool/busy", "--force").stdout
    assert "1 client connection(s) closed" in out, out
    with pytest.raises(nbd.Error):  # the server closed the connection
        h.pread(4096, 0)
    assert listing(srv)["allocated_bytes"] == 0
    assert srv.alive()
    with nbd_handle(srv, export="base") as b:
        b.pwrite(b"\x01" * 4096, 0)
        assert b.pread(4096, 0) == b"\x01" * 4096


def test_volumes_survive_restart_and_kill(server_factory):
    srv = server_factory(spec())
    volume(srv, "create", "pool/keep", "--size", "256MiB")
    data = pattern_bytes(21, 3 * MiB)
    with nbd_handle(srv, export="pool/keep") as h:
        h.pwrite(data, 10 * MiB)
        h.flush()
    with nbd_handle(srv, export="old") as h:
        h.pwrite(b"\x99" * MiB, 0)
        h.flush()
    volume(srv, "create", "pool/gone", "--size", "64MiB")
    volume(srv, "resize", "pool/keep", "--size", "384MiB")

    # A config-listed volume: delete takes it (and its [[export]]) out of the config too.
    before = listing(srv)["allocated_bytes"]
    out = volume(srv, "delete", "pool/old").stdout
    assert "strata.toml updated" in out and 'export "old" removed' in out, out
    assert listing(srv)["allocated_bytes"] == before - MiB
    config = srv.config_path.read_text()
    assert '"old"' not in config and '"base"' in config, config
    srv.keep_config = True  # the server's edit is now the truth
    volume(srv, "delete", "pool/gone")

    srv.restart()
    assert sorted(exports(srv)) == ["base", "pool/keep"]
    assert export_size(srv, "pool/keep") == 384 * MiB
    with nbd_handle(srv, export="pool/keep") as h:
        assert h.pread(len(data), 10 * MiB) == data
    assert [v["volume"] for v in listing(srv)["volumes"]] == ["base", "keep"]

    # kill -9 right after each change: each was durable when the command returned.
    volume(srv, "create", "pool/fresh", "--size", "128MiB")
    srv.crash()
    srv.start()
    assert export_size(srv, "pool/fresh") == 128 * MiB
    volume(srv, "resize", "pool/keep", "--size", "11MiB", "--shrink")
    srv.crash()
    srv.start()
    assert export_size(srv, "pool/keep") == 11 * MiB
    assert row(srv, "keep")["allocated_bytes"] == MiB, "only the first MiB of the data was kept"
    with nbd_handle(srv, export="pool/keep") as h:
        assert h.pread(MiB, 10 * MiB) == data[:MiB]
    volume(srv, "delete", "pool/fresh")
    srv.crash()
    srv.start()
    assert sorted(exports(srv)) == ["base", "pool/keep"]
    assert listing(srv)["allocated_bytes"] == MiB
    srv.stop()
    proc = subprocess.run([str(STRATA_BIN), "check", "--json", str(srv.disk_file("d0"))], capture_output=True,
                          text=True)
    report = json.loads(proc.stdout.splitlines()[0])
    assert proc.returncode == 0 and not report["errors"], report


def test_bad_requests_are_refused_precisely_and_the_server_keeps_serving(server_factory):
    srv = server_factory(spec())
    volume(srv, "create", "pool/v", "--size", "64MiB")
    cases = [
        (("create", "nopool/x", "--size", "1GiB"), 'no thin pool named "nopool" (pools: pool)'),
        (("create", "d0/x", "--size", "1GiB"), '"d0" is not a thin pool'),
        (("create", "pool/v", "--size", "1GiB"), "volume pool/v exists"),
        (("create", "pool/base", "--size", "1GiB"), "volume pool/base exists"),
        (("create", "pool/w", "--size", "1000"), "volume pool/w: size 1000 bytes is not a positive multiple of 512"),
        (("create", "pool/w", "--size", "lots"), '--size "lots"'),
        (("create", "pool/a b", "--size", "1GiB"), '"a b" is not a valid name'),
        (("create", "v", "--size", "1GiB"), "name a volume as POOL/NAME"),
        (("resize", "pool/nope", "--size", "1GiB"), "no volume pool/nope in pool pool"),
        (("resize", "pool/v", "--size", "1000"), "not a positive multiple of 512"),
        (("delete", "pool/nope"), "no volume pool/nope in pool pool"),
        (("delete", "nopool/v"), 'no thin pool named "nopool"'),
    ]
    for args, reason in cases:
        err = refused(srv, *args)
        assert reason in err, f"{args}: {err}"
    assert [v["volume"] for v in listing(srv)["volumes"]] == ["base", "old", "v"]
    assert row(srv, "v")["size"] == 64 * MiB
    assert srv.alive()
    with nbd_handle(srv, export="pool/v") as h:
        h.pwrite(b"\x42" * 4096, 0)
        assert h.pread(4096, 0) == b"\x42" * 4096
