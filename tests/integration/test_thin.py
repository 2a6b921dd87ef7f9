"""Thin pools through real clients: allocation on write, holes in the map, space returned
by trim, over-commit, persistence, and `strata check` on the pool's disk (clean, torn
tail, damaged superblock copy repaired, damaged checkpoint refused)."""

from __future__ import annotations

import json
import subprocess

import pytest

from harness import (MiB, GiB, STRATA_BIN, Disk, Export, Layer, ServerSpec, Volume, nbd_handle, pattern_bytes,
                     requires_strata, run)

pytestmark = requires_strata()

EXTENT = 64 * 1024


def thin_spec(volumes=(("vol", 1 * GiB),), extent=EXTENT, disk_size=256 * MiB) -> ServerSpec:
    return ServerSpec(
        disks=[Disk("d0", disk_size)],
        layers=[Layer(extent=extent, volumes=[Volume(n, s) for n, s in volumes])],
        exports=[Export(n, f"pool/{n}") for n, _ in volumes],
    )


def pool_status(srv) -> dict:
    status = srv.status()
    return next(d for d in status["devices"] if d["kind"] == "thin-pool")


def detail(node: dict, key: str) -> str:
    return dict(node["detail"])[key]


def allocated(srv) -> int:
    return int(detail(pool_status(srv), "extents allocated").split()[0])


def check(path, *flags) -> tuple[int, dict]:
    proc = subprocess.run([str(STRATA_BIN), "check", "--json", *flags, str(path)], capture_output=True, text=True)
    return proc.returncode, json.loads(proc.stdout.splitlines()[0])


def test_volume_larger_than_its_disk_allocates_on_write(server_factory):
    srv = server_factory(thin_spec())
    info = json.loads(run(["nbdinfo", "--json", srv.uri("vol")]).stdout)
    assert info["exports"][0]["export-size"] == 1 * GiB, "a 1 GiB volume on a 256 MiB disk"
    assert allocated(srv) == 0
    with nbd_handle(srv, export="vol") as h:
        assert h.pread(65536, 900 * MiB) == bytes(65536), "never-written blocks read as zeros"
        h.pwrite(pattern_bytes(1, 3 * EXTENT), 512 * MiB)
        h.flush()
    assert allocated(srv) == 3
    m = run(["qemu-img", "map", "--output=json", "-f", "raw", srv.uri("vol")]).stdout
    data = [e for e in json.loads(m) if e["data"]]
    assert [(e["start"], e["length"]) for e in data] == [(512 * MiB, 3 * EXTENT)], m
    nbdmap = run(["nbdinfo", "--map", srv.uri("vol")]).stdout
    assert f"{512 * MiB:>10}" in nbdmap and "data" in nbdmap, nbdmap


def test_trim_returns_extents_and_reused_space_shows_no_old_data(server_factory):
    srv = server_factory(thin_spec(volumes=(("a", 512 * MiB), ("b", 512 * MiB))))
    with nbd_handle(srv, export="a") as a:
        a.pwrite(pattern_bytes(2, 8 * EXTENT), 0)
        a.flush()
        assert allocated(srv) == 8
        a.trim(8 * EXTENT, 0)
        a.flush()
        assert allocated(srv) == 0, "wholly trimmed extents return to the pool"
        assert a.pread(8 * EXTENT, 0) == bytes(8 * EXTENT)
    with nbd_handle(srv, export="b") as b:
        for i in range(8):
            b.pwrite(b"\x5b" * 512, i * EXTENT + 1024)
        b.flush()
        got = b.pread(8 * EXTENT, 0)
    for i in range(8):
        extent = got[i * EXTENT:(i + 1) * EXTENT]
        assert extent[:1024] == bytes(1024) and extent[1536:] == bytes(EXTENT - 1536), "a's old bytes leaked into b"
        assert extent[1024:1536] == b"\x5b" * 512


def test_pool_survives_restart_and_checks_clean(server_factory):
    srv = server_factory(thin_spec())
    payload = pattern_bytes(3, 5 * MiB)
    with nbd_handle(srv, export="vol") as h:
        h.pwrite(payload, 700 * MiB)
    srv.restart()  # SIGTERM flushes, restart recovers
    with nbd_handle(srv, export="vol") as h:
        assert h.pread(len(payload), 700 * MiB) == payload
    srv.stop()
    rc, report = check(srv.disk_file("d0"))
    assert rc == 0 and not report["errors"] and not report["warnings"], report
    assert report["owner"] == "thin-pool"


def test_check_repairs_a_damaged_superblock_copy_and_refuses_a_damaged_checkpoint(server_factory):
    srv = server_factory(thin_spec())
    with nbd_handle(srv, export="vol") as h:
        h.pwrite(pattern_bytes(4, 2 * MiB), 0)
        h.flush()
    srv.stop()
    disk = srv.disk_file("d0")
    rc, before = check(disk)
    assert rc == 0, before
    # Damage the older superblock copy: the newer one still describes everything.
    older = 1 - before["generation"] % 2
    with open(disk, "r+b") as f:
        f.seek(before["metadata_offset"] + older * 4096 + 100)
        f.write(b"\xff" * 32)
    rc, report = check(disk)
    assert rc == 0 and any("superblock copy" in w for w in report["warnings"]), report
    rc, report = check(disk, "--repair")
    assert rc == 0 and report["repaired"], report
    rc, report = check(disk)
    assert rc == 0 and not report["warnings"], report
    # A damaged checkpoint cannot be repaired without guessing: reported, left alone.
    with open(disk, "r+b") as f:
        f.seek(report["checkpoint_offset"] + 200)
        f.write(b"\x00\x11" * 16)
    rc, report = check(disk, "--repair")
    assert rc == 1 and any("checkpoint" in e for e in report["errors"]) and not report["repaired"], report
    # And the server refuses to start on it rather than serve wrong data.
    proc = subprocess.run([str(STRATA_BIN), "serve", "--config", str(srv.config_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert "checkpoint" in proc.stderr, proc.stderr[-2000:]
