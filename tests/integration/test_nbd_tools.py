"""nbdinfo, nbdcopy and fio (ioengine=nbd) against strata."""

from __future__ import annotations

import json
import random
import re

import nbd

from harness import MiB, Disk, Export, ServerSpec, nbd_handle, pattern_bytes, requires_strata, run, sha256_file


def nbdinfo_json(uri):
    return json.loads(run(["nbdinfo", "--json", uri]).stdout)


def test_nbdinfo_json(server):
    info = nbdinfo_json(server.uri())
    assert info["protocol"] == "newstyle-fixed"
    assert info["structured"] is True
    (e,) = info["exports"]
    assert e["export-name"] == "vol"
    assert e["export-size"] == server.export_size()
    assert "base:allocation" in e["contexts"]
    assert e["is_read_only"] is False
    for k in ["can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn", "can_cache"]:
        assert e[k] is True, (k, e)
    assert e["block_size_minimum"] == 1
    assert e["block_size_preferred"] == 4096
    assert e["block_size_maximum"] == 32 * MiB


def test_nbdinfo_read_only(server_factory):
    srv = server_factory(ServerSpec(disks=[Disk("d0", 8 * MiB)], exports=[Export("ro", "d0", read_only=True)]))
    (e,) = nbdinfo_json(srv.uri())["exports"]
    assert e["is_read_only"] is True
    assert e["export-size"] == 8 * MiB


def test_nbdinfo_map(server):
    with nbd_handle(server) as h:
        h.pwrite(pattern_bytes(1, 3 * MiB), 0)
        h.pwrite(pattern_bytes(2, 2 * MiB), 10 * MiB)
        h.flush()
        h.trim(MiB, MiB)
        h.flush()
    out = run(["nbdinfo", "--map", "--json", server.uri()]).stdout
    m = json.loads(out)
    assert sum(x["length"] for x in m) == server.export_size()
    pos = 0
    for x in m:
        assert x["offset"] == pos
        pos += x["length"]

    def flags_over(lo, hi):
        return {x["type"] for x in m if x["offset"] < hi and x["offset"] + x["length"] > lo}

    assert flags_over(0, MiB) == {0}, m
    assert flags_over(2 * MiB, 3 * MiB) == {0}, m
    assert flags_over(10 * MiB, 12 * MiB) == {0}, m
    assert all(t & nbd.STATE_ZERO for t in flags_over(MiB, 2 * MiB)), m
    assert all(t & nbd.STATE_ZERO for t in flags_over(3 * MiB, 10 * MiB)), m
    assert all(t & nbd.STATE_ZERO for t in flags_over(12 * MiB, server.export_size())), m
    text = run(["nbdinfo", "--map", server.uri()]).stdout
    assert re.search(r"^\s*0\s+1048576\s+0\s+data$", text, re.M), text
    assert "hole,zero" in text or "zero" in text


@requires_strata()
def test_nbdinfo_list(server_factory):
    spec = ServerSpec(
        disks=[Disk("d0", 16 * MiB), Disk("d1", 8 * MiB)],
        exports=[Export("vol", "d0", description="a volume"),
                 Export("backup", "d1", read_only=True, description="backup copy"),
                 Export("alias", "d0")],
    )
    srv = server_factory(spec)
    info = json.loads(run(["nbdinfo", "--list", "--json", f"nbd+unix:///?socket={srv.sock}"]).stdout)
    by = {e["export-name"]: e for e in info["exports"]}
    assert set(by) == {"vol", "backup", "alias"}
    assert by["vol"]["description"] == "a volume"
    assert by["backup"]["description"] == "backup copy"
    assert by["backup"]["is_read_only"] is True
    assert by["vol"]["export-size"] == 16 * MiB
    assert by["backup"]["export-size"] == 8 * MiB
    assert by["alias"]["export-size"] == 16 * MiB
    text = run(["nbdinfo", "--list", f"nbd+unix:///?socket={srv.sock}"]).stdout
    assert 'export="vol"' in text and "a volume" in text
    assert 'export="backup"' in text and "backup copy" in text


def test_nbdcopy_roundtrip(server, workdir):
    src = workdir / "src.img"
    data = bytearray(random.Random(5).randbytes(64 * MiB))
    data[10 * MiB:14 * MiB] = bytes(4 * MiB)
    src.write_bytes(data)
    run(["nbdcopy", src, server.uri()])
    out = workdir / "out.img"
    # copy out exactly 64 MiB: read through a second nbdcopy into a file of that size
    run(["nbdcopy", server.uri(), out], timeout=120)
    assert out.stat().st_size == server.export_size()
    assert sha256_file(out, 64 * MiB) == sha256_file(src)
    with open(out, "rb") as f:
        f.seek(64 * MiB)
        rest = f.read()
    assert rest.count(0) == len(rest)


def test_nbdcopy_parallel(server, workdir):
    src = workdir / "src.img"
    src.write_bytes(random.Random(6).randbytes(64 * MiB))
    run(["nbdcopy", "--connections=4", "--requests=32", "--request-size=1048576", src, server.uri()])
    out = workdir / "out.img"
    run(["nbdcopy", "--connections=4", "--requests=16", server.uri(), out])
    assert sha256_file(out, 64 * MiB) == sha256_file(src)


def fio_job(path, server, name: str, **options):
    """Writes a fio job file for one job `name` over `server` with the nbd engine."""
    settings = "".join(f"{key}={value}\n" for key, value in options.items())
    path.write_text(f"[global]\nioengine=nbd\nuri={server.uri()}\n{settings}\n[{name}]\n")
    return path


def test_fio_nbd_randrw_verify(server, workdir):
    job = fio_job(workdir / "verify.fio", server, "randrw-verify", rw="randrw", bs="4k", iodepth=32,
                  numjobs=4, size="16m", offset_increment="16m", verify="crc32c", do_verify=1,
                  verify_fatal=1, verify_dump=0, group_reporting=1)
    r = run(["fio", "--output-format=json", job], timeout=300, cwd=workdir)
    res = json.loads(r.stdout[r.stdout.index("{"):])
    (j,) = res["jobs"]
    assert j["error"] == 0, j
    assert j["write"]["io_bytes"] > 0 and j["read"]["io_bytes"] > 0
    assert "verify" not in r.stderr.lower(), r.stderr
    # a verify pass over data that was NOT written by the job must fail: proves the check is live
    with nbd_handle(server) as h:
        h.pwrite(pattern_bytes(1, 4096), 0)
        h.flush()
    check = fio_job(workdir / "check.fio", server, "v", rw="read", bs="4k", size="1m", verify="crc32c",
                    verify_only=1, verify_dump=0)
    r2 = run(["fio", check], check=False, timeout=120, cwd=workdir)
    assert r2.returncode != 0, r2.stdout + r2.stderr
    assert "verify: bad magic header" in r2.stdout + r2.stderr, r2.stdout + r2.stderr
