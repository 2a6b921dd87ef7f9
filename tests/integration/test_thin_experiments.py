"""The Virtual Allocation paper's space experiments on a thin pool, with ext4 on its volumes
(nbdfuse exposes an export as a file, a loop device over it, ext4 on that):

- Table IV (reclaim after a purge): write a big file, delete it, fstrim; the pool's allocated
  extents return to where they were before the file.
- Table V (reclaim under small-file churn): create and delete many small files in rounds,
  fstrim after each; allocated extents stay bounded.
- Two ext4 filesystems at once on one over-committed pool: both written, both verified, both
  fsck clean.

Counts come from `strata status --json` (the pool's "extents allocated") and from statvfs on
the mounted filesystem (its used 4 KiB blocks); run with `-s` to see the tables printed. The
default sizes keep the file under a minute; STRATA_THIN_EXPERIMENTS_LARGE=1 runs the paper's
2 GiB file and a longer churn.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from harness import MiB, GiB, Disk, Export, Layer, ServerSpec, Volume, block_device, mount, run, unmount
from test_ext4 import _can_do_block_devices, make_tree, tree_digests

pytestmark = pytest.mark.skipif(_can_do_block_devices() is not None, reason=str(_can_do_block_devices()))

LARGE = os.environ.get("STRATA_THIN_EXPERIMENTS_LARGE") == "1"
EXTENT = 512 * 1024  # the paper's default extent
BLOCKS_PER_EXTENT = EXTENT // 4096
# mkfs writes its inode tables and journal now instead of from a kernel thread later, so the
# counts taken after mkfs are final (the paper's "FS create" row) and nothing else writes.
MKFS = ["mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0"]


def pool_spec(disk_size: int, volumes: list[tuple[str, int]]) -> ServerSpec:
    return ServerSpec(
        disks=[Disk("d0", disk_size)],
        layers=[Layer(extent=EXTENT, volumes=[Volume(n, s) for n, s in volumes])],
        exports=[Export(n, f"pool/{n}") for n, _ in volumes],
    )


def pool_counts(srv) -> tuple[int, int]:
    """(extents allocated, extents in the pool) from `strata status --json`."""
    pool = next(d for d in srv.status()["devices"] if d["kind"] == "thin-pool")
    used, _, total = dict(pool["detail"])["extents allocated"].split()
    return int(used), int(total)


def allocated(srv) -> int:
    return pool_counts(srv)[0]


def fs_used_blocks(mnt: Path) -> int:
    """Blocks in use, the filesystem's own metadata included (mounted `minixdf`), like the
    paper's "live blocks"."""
    st = os.statvfs(mnt)
    assert st.f_frsize == 4096
    return st.f_blocks - st.f_bfree


@contextlib.contextmanager
def mounted(loop: str, mnt: Path, options: str = "rw"):
    mount(loop, mnt, f"{options},minixdf")
    try:
        yield mnt
    finally:
        if os.path.ismount(mnt):
            unmount(mnt, check=False)


def settle(loop: str) -> None:
    """Everything the filesystem wrote has reached the server: sync writes back the
    filesystem and the loop device, whose writes nbdfuse forwards and flushes."""
    run(["sync"])
    run(["blockdev", "--flushbufs", loop])


def fstrim(mnt: Path) -> int:
    """Trims the filesystem's free space; returns the bytes fstrim reports trimmed."""
    out = run(["fstrim", "-v", mnt]).stdout  # "/mnt: 973.4 MiB (1020626944 bytes) trimmed"
    return int(out.split("(")[1].split()[0])


class Table:
    """Rows printed like the paper's Tables IV and V."""

    def __init__(self, title: str):
        self.title = title
        self.rows: list[tuple[str, int, int]] = []

    def add(self, operation: str, fs_blocks: int, extents: int) -> None:
        self.rows.append((operation, fs_blocks, extents))

    def print(self) -> None:
        print(f"\n{self.title}\n")
        print("| operation | ext4 used blocks | pool extents allocated (4 KiB blocks) |")
        print("|---|---:|---:|")
        for op, blocks, extents in self.rows:
            print(f"| {op} | {blocks:,} | {extents:,} ({extents * BLOCKS_PER_EXTENT:,}) |")


def test_table_iv_big_file_deleted_and_trimmed_returns_its_extents(server_factory, workdir):
    file_mib = 2048 if LARGE else 256
    volume = 4 * GiB if LARGE else 1 * GiB
    srv = server_factory(pool_spec(volume, [("vol", volume)]))
    table = Table(f"Table IV: a {file_mib} MiB file written, deleted, trimmed (512 KiB extents, {volume // MiB} MiB "
                  f"volume)")
    table.add("1. initial", 0, allocated(srv))
    assert allocated(srv) == 0
    with block_device(srv, workdir, "vol", export="vol") as loop:
        run(MKFS + [loop], timeout=300)
        settle(loop)
        # Mounted without `discard`: a delete sends nothing down; fstrim is the reclaim step,
        # as the paper's explicit reclaim is.
        with mounted(loop, workdir / "mnt") as mnt:
            settle(loop)
            fs_base, base = fs_used_blocks(mnt), allocated(srv)
            table.add("2. mkfs + mount", fs_base, base)
            chunk = random.Random(4).randbytes(MiB)
            with open(mnt / "big", "wb") as f:
                for _ in range(file_mib):
                    f.write(chunk)
            settle(loop)
            fs_full, full = fs_used_blocks(mnt), allocated(srv)
            table.add("3. file written", fs_full, full)
            (mnt / "big").unlink()
            settle(loop)
            fs_deleted, deleted = fs_used_blocks(mnt), allocated(srv)
            table.add("4. file deleted", fs_deleted, deleted)
            trimmed = fstrim(mnt)
            settle(loop)
            fs_trimmed, after = fs_used_blocks(mnt), allocated(srv)
            table.add("5. fstrim", fs_trimmed, after)
    table.print()
    file_extents = file_mib * MiB // EXTENT
    reclaimed = (deleted - after) / (full - base)
    print(f"\nfile: {file_extents} extents of data; allocated by writing it: {full - base}; returned by fstrim: "
          f"{deleted - after} ({reclaimed:.1%}); fstrim reported {trimmed // MiB} MiB trimmed")
    assert full - base >= file_extents, "every extent of the file's data was allocated on write"
    assert full - base <= file_extents + 8, "writing the file allocated little besides its data"
    assert deleted == full, "a delete without discard returns nothing (the paper's row 4)"
    assert after <= base, f"fstrim returned the pool to {after} extents, above the {base} before the file"
    assert reclaimed >= 0.99, "the paper reclaimed 100% of a deleted big file's extents"


def churn_round(rng: random.Random, root: Path, live: list[Path], creates: int, delete_share: float,
                serial: list[int], written) -> None:
    """Creates `creates` files of 8-64 KiB (Postmark's sizes) in 20 folders, calls `written`
    (which makes them reach the disk: deleted before that, ext4's delayed allocation would
    never write them), then deletes `delete_share` of all live files, chosen at random."""
    for _ in range(creates):
        d = root / f"d{rng.randrange(20):02d}"
        d.mkdir(exist_ok=True)
        path = d / f"f{serial[0]:06d}"
        serial[0] += 1
        path.write_bytes(rng.randbytes(rng.randrange(8 * 1024, 64 * 1024 + 1)))
        live.append(path)
    written()
    rng.shuffle(live)
    doomed = int(len(live) * delete_share)
    for path in live[:doomed]:
        path.unlink()
    del live[:doomed]


def test_table_v_small_file_churn_keeps_allocated_extents_bounded(server_factory, workdir):
    rounds = 12 if LARGE else 6
    creates = 4000 if LARGE else 1500
    srv = server_factory(pool_spec(2 * GiB if LARGE else 512 * MiB, [("vol", 2 * GiB if LARGE else 1 * GiB)]))
    table = Table(f"Table V: small-file churn, {rounds} rounds of {creates} files of 8-64 KiB created and 70% of "
                  f"the live files deleted, fstrim after each round")
    rng = random.Random(5)
    live: list[Path] = []
    serial = [0]
    trimmed_counts: list[int] = []
    untrimmed_counts: list[int] = []
    with block_device(srv, workdir, "vol", export="vol") as loop:
        run(MKFS + [loop], timeout=300)
        with mounted(loop, workdir / "mnt") as mnt:
            settle(loop)
            base, fs_base = allocated(srv), fs_used_blocks(mnt)
            table.add("mkfs + mount", fs_base, base)
            for r in range(rounds):
                churn_round(rng, mnt, live, creates, 0.7, serial, lambda: settle(loop))
                settle(loop)
                untrimmed_counts.append(allocated(srv))
                table.add(f"round {r + 1}: {creates} created, 70% deleted", fs_used_blocks(mnt), allocated(srv))
                fstrim(mnt)
                settle(loop)
                trimmed_counts.append(allocated(srv))
                table.add(f"round {r + 1}: fstrim", fs_used_blocks(mnt), allocated(srv))
            # The paper's rows 6-8: new files after the reclaim partly refill extents that
            # are still partially live (the filesystem reuses its own freed blocks).
            before_refill, fs_before_refill, live_files = allocated(srv), fs_used_blocks(mnt), len(live)
            churn_round(rng, mnt, live, creates, 0.0, serial, lambda: settle(loop))
            settle(loop)
            refill_blocks = fs_used_blocks(mnt) - fs_before_refill
            refill_extents = allocated(srv) - before_refill
            table.add(f"{creates} more files written", fs_used_blocks(mnt), allocated(srv))
            final_fs_blocks, final_extents = fs_used_blocks(mnt), allocated(srv)
    table.print()
    live_bytes = (final_fs_blocks - fs_base) * 4096
    print(f"\nreclaimed by each fstrim: {[u - t for u, t in zip(untrimmed_counts, trimmed_counts)]} extents; "
          f"after the last fstrim {trimmed_counts[-1]} extents for {live_files} live files; the refill wrote "
          f"{refill_blocks:,} blocks ({refill_blocks * 4096 / EXTENT:.0f} extents' worth) and allocated "
          f"{refill_extents} new extents; space amplification at the end "
          f"{(final_extents - base) * EXTENT / live_bytes:.2f}x (pool bytes allocated since mkfs / ext4 blocks in use "
          f"since mkfs)")
    assert sum(untrimmed_counts) > sum(trimmed_counts), "fstrim returned the extents that churn emptied"
    # Bounded: the live set converges (30% of each round's files and of the survivors before
    # them stay, about 640 files), so the allocated extents must converge too. Without
    # reclaim every round would keep all it allocated (about 115 extents here); with it the
    # last round keeps at most half of what it allocated.
    last_allocated = untrimmed_counts[-1] - trimmed_counts[-2]
    last_kept = trimmed_counts[-1] - trimmed_counts[-2]
    assert last_kept <= last_allocated // 2, f"the last round kept {last_kept} of its {last_allocated} new extents"
    # And overall at most 3/4 of everything the rounds allocated is still allocated.
    previous = [base] + trimmed_counts[:-1]
    allocated_by_rounds = sum(u - p for u, p in zip(untrimmed_counts, previous))
    assert trimmed_counts[-1] - base <= allocated_by_rounds * 3 // 4, "allocation grew with the churn"


def test_two_ext4_filesystems_on_one_overcommitted_pool(server_factory, workdir):
    disk = 384 * MiB
    srv = server_factory(pool_spec(disk, [("a", 1 * GiB), ("b", 1 * GiB)]))
    _, pool_extents = pool_counts(srv)
    assert pool_extents * EXTENT < 2 * GiB, "the two volumes together are larger than the pool"
    sources = {}
    for name, seed in (("a", 11), ("b", 12)):
        src = workdir / f"src-{name}"
        src.mkdir()
        make_tree(src, seed=seed, nfiles=80)
        sources[name] = tree_digests(src)
    assert sources["a"] != sources["b"]
    with contextlib.ExitStack() as stack:
        loops = {name: stack.enter_context(block_device(srv, workdir, name, export=name)) for name in ("a", "b")}
        for loop in loops.values():
            run(MKFS + [loop], timeout=300)
        mounts = {name: stack.enter_context(mounted(loop, workdir / f"mnt-{name}")) for name, loop in loops.items()}
        # Both filesystems write at once, their extents interleaving in the pool's log.
        errors: list[BaseException] = []

        def copy(name: str) -> None:
            try:
                shutil.copytree(workdir / f"src-{name}", mounts[name] / "tree")
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=copy, args=(n,)) for n in mounts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for name, loop in loops.items():
            settle(loop)
        for name, mnt in mounts.items():
            assert tree_digests(mnt / "tree") == sources[name], f"files differ on {name} while both are mounted"
        used = allocated(srv)
        written = sum(fs_used_blocks(m) for m in mounts.values()) * 4096
        print(f"\ntwo 1 GiB ext4 volumes on a {disk // MiB} MiB pool ({pool_extents} extents): {used} extents "
              f"allocated ({used * EXTENT // MiB} MiB) for {written // MiB} MiB in use by the two filesystems "
              f"(inode tables included: mkfs zeroes them, which allocates nothing)")
        assert used < pool_extents
        data = sum(p.stat().st_size for name in mounts for p in (workdir / f"src-{name}").rglob("*") if p.is_file())
        assert used * EXTENT >= data, "the files of both filesystems are on allocated extents"
        for mnt in mounts.values():
            unmount(mnt)
        for name, loop in loops.items():
            settle(loop)
            r = run(["e2fsck", "-fn", loop], check=False, timeout=180)
            assert r.returncode == 0, f"e2fsck ({name}) found problems:\n{r.stdout}\n{r.stderr}"
            with mounted(loop, workdir / f"ro-{name}", "ro") as mnt:
                assert tree_digests(mnt / "tree") == sources[name], f"files differ on {name} after fsck"
