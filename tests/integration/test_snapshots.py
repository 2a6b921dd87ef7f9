"""Versions of thin volumes (`strata snapshot …`) through real clients: a snapshot taken while
a client writes holds exactly what was acknowledged before it, is exported read-only and read
by libnbd, qemu-img and nbdinfo (holes included) while the volume goes on changing; clones are
writable and exported at once; rollback, deletion in any order and a restart keep every other
version byte-identical; bad requests get a precise refusal and the server serves on."""

from __future__ import annotations

import json
import subprocess

import nbd

from harness import (admin_command, admin_refused, MiB, STRATA_BIN, Disk, Export, Layer, ServerSpec, Volume, nbd_handle, pattern_bytes,
                     requires_strata, run)

pytestmark = requires_strata()

EXTENT = 64 * 1024
SIZE = 64 * MiB


def spec() -> ServerSpec:
    return ServerSpec(
        disks=[Disk("d0", 256 * MiB)],
        layers=[Layer(extent=EXTENT, volumes=[Volume("v", SIZE)])],
        exports=[Export("v", "pool/v")],
    )


def snapshot(srv, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return admin_command(srv, "snapshot", *args, check=check)


def refused(srv, *args: str) -> str:
    return admin_refused(srv, "snapshot", *args)


def listed(srv, of: str = "pool/v") -> dict[str, dict]:
    rows = json.loads(snapshot(srv, "list", of, "--json").stdout)
    return {row["name"]: row for row in rows}


def read_export(srv, export: str, offset: int, length: int) -> bytes:
    with nbd_handle(srv, export=export) as h:
        return h.pread(length, offset)


def test_snapshots_export_clone_rollback_delete_and_restart(server_factory, tmp_path):
    srv = server_factory(spec())
    first = pattern_bytes(1, 4 * MiB)
    second = pattern_bytes(2, 1 * MiB)
    with nbd_handle(srv, export="v") as h:
        h.pwrite(first, 0)
        h.flush()
        out = snapshot(srv, "create", "pool/v", "first").stdout
        assert "snapshot pool/v@first taken" in out, out
        # The client goes on writing over part of what the snapshot holds.
        h.pwrite(second, 1 * MiB)
        h.pwrite(second, 32 * MiB)
        h.flush()

    rows = listed(srv)
    assert list(rows) == ["first"]
    assert rows["first"]["size"] == SIZE
    # Only the 1 MiB the volume overwrote is the snapshot's own; the other 3 MiB it shares.
    assert rows["first"]["unique_bytes"] == 1 * MiB, rows
    assert rows["first"]["shared_bytes"] == 3 * MiB, rows
    table = snapshot(srv, "list", "pool").stdout
    assert "pool/v@first" in table and "1MiB" in table, table

    # Exported read-only while the volume is in use; libnbd, qemu-img and nbdinfo read it.
    out = snapshot(srv, "export", "pool/v", "first").stdout
    assert "read-only" in out, out
    uri = srv.uri("pool/v@first")
    assert read_export(srv, "pool/v@first", 0, 4 * MiB) == first
    assert read_export(srv, "pool/v@first", 32 * MiB, MiB) == b"\0" * MiB
    reference = tmp_path / "first.img"
    reference.write_bytes(first + b"\0" * (SIZE - len(first)))
    run(["qemu-img", "compare", "-f", "raw", "-F", "raw", str(reference), uri])
    with nbd_handle(srv, export="pool/v@first") as h:
        assert h.is_read_only()
        try:
            h.pwrite(b"x" * 4096, 0)
            raise AssertionError("a write to a snapshot was accepted")
        except nbd.Error:
            pass
    extents = json.loads(run(["nbdinfo", "--map", "--json", uri]).stdout)
    data = [e for e in extents if e["type"] & 1 == 0]
    holes = [e for e in extents if e["type"] & 1 == 1]
    assert data and data[0]["offset"] == 0 and data[0]["length"] == 4 * MiB, extents
    assert sum(e["length"] for e in holes) == SIZE - 4 * MiB, extents
    with nbd_handle(srv, export="v") as h:
        assert h.pread(MiB, 1 * MiB) == second

    # A clone is writable, exported at once, and leaves its snapshot alone.
    out = snapshot(srv, "clone", "pool/v", "first", "c").stdout
    assert 'exported as "pool/c"' in out, out
    with nbd_handle(srv, export="pool/c") as h:
        assert h.pread(4 * MiB, 0) == first
        h.pwrite(b"\xcc" * MiB, 0)
        h.flush()
    assert read_export(srv, "pool/v@first", 0, MiB) == first[:MiB]

    # A second snapshot, then roll the volume back to the first.
    snapshot(srv, "create", "pool/v", "second")
    snapshot(srv, "rollback", "pool/v", "first")
    with nbd_handle(srv, export="v") as h:
        assert h.pread(4 * MiB, 0) == first
        assert h.pread(MiB, 32 * MiB) == b"\0" * MiB
    snapshot(srv, "export", "pool/v", "second")
    assert read_export(srv, "pool/v@second", 1 * MiB, MiB) == second

    # Deleting the first (a clone's base) ends its export; the rest stays as it was.
    out = snapshot(srv, "delete", "pool/v", "first").stdout
    assert "pool/v@first is gone" in out, out
    exports = [e["name"] for e in srv.status()["exports"]]
    assert "pool/v@first" not in exports and "pool/v@second" in exports, exports
    assert read_export(srv, "pool/c", MiB, 3 * MiB) == first[MiB:]
    assert read_export(srv, "pool/v@second", 32 * MiB, MiB) == second

    # Everything survives a restart (snapshot exports are not kept: export again).
    srv.restart()
    assert list(listed(srv)) == ["second"]
    snapshot(srv, "export", "pool/v", "second")
    assert read_export(srv, "pool/v@second", 0, MiB) == first[:MiB]
    assert read_export(srv, "pool/v@second", 1 * MiB, MiB) == second
    assert read_export(srv, "pool/c", 0, MiB) == b"\xcc" * MiB
    assert read_export(srv, "v", 0, 4 * MiB) == first


def test_bad_snapshot_requests_are_refused_precisely_and_the_server_serves_on(server_factory):
    srv = server_factory(ServerSpec(
        disks=[Disk("d0", 256 * MiB)],
        layers=[Layer(extent=EXTENT, volumes=[Volume("v", SIZE), Volume("w", SIZE)])],
        exports=[Export("v", "pool/v"), Export("w", "pool/w")],
    ))
    config_before = srv.config_path.read_text()
    with nbd_handle(srv, export="v") as h:
        h.pwrite(b"\x11" * MiB, 0)
        h.flush()
    snapshot(srv, "create", "pool/v", "s1")
    assert 'no volume named "nope"' in refused(srv, "create", "pool/nope")
    assert 'already' in refused(srv, "create", "pool/v", "s1")
    assert "use letters" in refused(srv, "create", "pool/v", "a/b")
    assert 'no snapshot named "s9"' in refused(srv, "delete", "pool/v", "s9")
    assert 'no snapshot named "s9"' in refused(srv, "rollback", "pool/v", "s9")
    assert "no thin pool" in refused(srv, "create", "other/v") or "no layer" in refused(srv, "create", "other/v")
    assert "POOL/VOLUME" in refused(srv, "create", "v")
    # A volume with snapshots is neither deleted nor shrunk.
    r = subprocess.run([str(STRATA_BIN), "volume", "delete", "pool/v", "--data-dir", str(srv.data_dir)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "has snapshots: s1" in r.stderr, r.stderr
    r = subprocess.run([str(STRATA_BIN), "volume", "resize", "pool/v", "--size", "1MiB", "--shrink",
                        "--data-dir", str(srv.data_dir)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not shrink" in r.stderr, r.stderr
    # The refused delete changed nothing: the config, the export and the data are as before.
    assert srv.config_path.read_text() == config_before
    assert "v" in [e["name"] for e in srv.status()["exports"]]
    with nbd_handle(srv, export="v") as h:
        assert h.pread(MiB, 0) == b"\x11" * MiB
