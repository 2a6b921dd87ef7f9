"""Issue 4's end-to-end test: ext4 on `crypt` over `raid5` (4 members) survives a member
failure, an online rebuild onto a new disk, and a `kill -9` of the server in the middle of
that rebuild, with a clean fsck and identical files afterwards. Then it loses another member,
which proves the rebuilt one holds the right data."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness import MiB, Disk, Export, Layer, ServerSpec, assert_fsck_clean, block_device, mounted, run
from test_ext4 import _can_do_block_devices, make_tree, tree_digests
from test_hierarchy import layer_node, strata, wait_idle

pytestmark = pytest.mark.skipif(_can_do_block_devices() is not None, reason=str(_can_do_block_devices()))


def fsck_and_compare(srv, workdir: Path, tag: str, want: dict) -> None:
    with block_device(srv, workdir, tag) as loop:
        assert_fsck_clean(loop, tag)
        with mounted(loop, workdir / f"mnt-{tag}", "ro") as mnt:
            assert tree_digests(mnt / "tree") == want, f"files differ ({tag})"


def test_ext4_on_raid5_and_crypt_survives_failure_rebuild_and_kill9(server_factory, workdir):
    key_file = workdir / "enc.key"
    key_file.write_bytes(os.urandom(64))
    spec = ServerSpec(
        disks=[Disk(f"d{i}", 160 * MiB) for i in range(4)],
        layers=[
            Layer(name="r5", kind="raid5", children=[f"d{i}" for i in range(4)], options={"chunk": "64KiB"}),
            Layer(name="enc", kind="crypt", children=["r5"], options={"key-file": str(key_file)}),
        ],
        exports=[Export("vol", "enc")],
    )
    srv = server_factory(spec)
    src = workdir / "src"
    src.mkdir()
    make_tree(src, seed=404, nfiles=120)
    want = tree_digests(src)

    with block_device(srv, workdir, "mkfs") as loop:
        run(["mkfs.ext4", "-q", "-F", loop], timeout=120)
        with mounted(loop, workdir / "mnt") as mnt:
            import shutil
            shutil.copytree(src, mnt / "tree")
            run(["sync"])
    # No plaintext on the members.
    sample = (srv.disk_file("d0")).read_bytes()[:64 * MiB]
    assert b"lost+found" not in sample

    strata("fail-member", "--data-dir", srv.data_dir, "r5", "d1")
    srv.keep_config = True
    assert layer_node(srv, "r5")["health"] == "degraded"
    fsck_and_compare(srv, workdir, "degraded", want)

    new_disk = workdir / "d4.img"
    strata("replace", "--data-dir", srv.data_dir, "r5", "d1", new_disk)
    # Kill the server while the rebuild runs (or just after, on a fast machine).
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        activity = layer_node(srv, "r5").get("activity")
        if activity:
            seen.append(activity["done_bytes"])
            if activity["done_bytes"] > 0:
                break
        else:
            break
        time.sleep(0.01)
    srv.crash()
    print(f"killed with the rebuild at {seen[-1] if seen else 'done'} bytes")
    srv.start()
    wait_idle(srv, "r5", timeout=120)
    node = layer_node(srv, "r5")
    assert node["health"] == "ok", node
    fsck_and_compare(srv, workdir, "rebuilt", want)

    # Lose another member: the rebuilt one now carries its share of every stripe.
    strata("fail-member", "--data-dir", srv.data_dir, "r5", "d0")
    fsck_and_compare(srv, workdir, "after-second-failure", want)
