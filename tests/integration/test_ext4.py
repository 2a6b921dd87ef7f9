"""A real filesystem on a strata export: nbdfuse → loop device → ext4."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from harness import MiB, Disk, Export, ServerSpec, block_device, mount, run, unmount


def _can_do_block_devices() -> str | None:
    if os.geteuid() != 0:
        return "needs root (losetup, mount)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if not os.path.exists("/dev/loop-control"):
        return "no loop device support"
    for tool in ["nbdfuse", "losetup", "mkfs.ext4", "e2fsck", "fusermount3", "mount", "umount"]:
        if not shutil.which(tool):
            return f"{tool} missing"
    return None


pytestmark = pytest.mark.skipif(_can_do_block_devices() is not None, reason=str(_can_do_block_devices()))


def make_tree(root: Path, seed=2024, nfiles=200):
    rng = random.Random(seed)
    dirs = [root]
    for i in range(25):
        d = rng.choice(dirs) / f"dir{i:02d}"
        d.mkdir(parents=True)
        dirs.append(d)
    for i in range(nfiles):
        size = rng.choice([0, 1, 511, 4096, 4097, rng.randrange(1, 64 * 1024)] + [rng.randrange(1, MiB + 1)] * 6)
        data = rng.randbytes(size)
        if rng.random() < 0.2 and size > 8192:  # some sparse-looking content
            mid = size // 2
            data = data[:mid // 2] + bytes(mid) + data[mid // 2 + mid:]
        (rng.choice(dirs) / f"file{i:03d}.bin").write_bytes(data)


def tree_digests(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_a_namespace_made_while_mounted_does_not_keep_the_file_system(workdir):
    """A process started by `ip netns exec` while an ext4 is mounted (as tests running beside
    each other do) holds a copy of the mount in its own mount namespace; once unmounted here,
    the file system mounts again at once. Over a private mount it would not (EBUSY) until the
    process ended: harness.mount's shared bind is what lets it go."""
    from netns import hosts

    image = workdir / "small.img"
    with open(image, "wb") as f:
        f.truncate(32 * MiB)
    run(["mkfs.ext4", "-q", "-F", image])
    loop = run(["losetup", "-f", "--show", image]).stdout.strip()
    try:
        with hosts(1) as [(ns, _)]:
            mnt = workdir / "mnt"
            mount(loop, mnt)
            inside = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"])
            try:
                time.sleep(0.5)  # the namespace's process is up, with its copy of the mount
                unmount(mnt)
                mount(loop, mnt, "ro")
                unmount(mnt)
            finally:
                inside.kill()
                inside.wait()
    finally:
        run(["losetup", "-d", loop], check=False)


def test_ext4_on_export(server_factory, workdir):
    srv = server_factory(ServerSpec(disks=[Disk("d0", 512 * MiB)], exports=[Export("vol", "d0")]))
    src = workdir / "src"
    src.mkdir()
    make_tree(src)
    want = tree_digests(src)
    assert sum(1 for v in want.values() if v != "dir") == 200
    assert sum(p.stat().st_size for p in src.rglob("*") if p.is_file()) > 40 * MiB

    mnt = workdir / "mnt"
    mnt.mkdir()
    with block_device(srv, workdir, "ext4") as loop:
        assert loop.startswith("/dev/loop")
        assert int(run(["blockdev", "--getsize64", loop]).stdout) == 512 * MiB
        mounted = False
        try:
            run(["mkfs.ext4", "-q", "-F", loop], timeout=120)
            mount(loop, mnt)
            mounted = True
            shutil.copytree(src, mnt / "tree")
            run(["sync"])
            unmount(mnt)
            mounted = False
            run(["blockdev", "--flushbufs", loop], check=False)
            r = run(["e2fsck", "-fn", loop], check=False, timeout=120)
            assert r.returncode == 0, f"e2fsck found problems:\n{r.stdout}\n{r.stderr}"
            mount(loop, mnt, "ro")
            mounted = True
            got = tree_digests(mnt / "tree")
            assert got == want
        finally:
            if mounted:
                unmount(mnt, check=False)
    assert srv.alive()
    # the filesystem really lives in strata's backing file
    with open(srv.disk_file(), "rb") as f:
        f.seek(1024 + 56)
        assert f.read(2) == b"\x53\xef", "no ext4 superblock in the backing file"
