"""Versions of a thin volume under real clients.

1. ext4 (nbdfuse → loop → ext4) on a thin volume is changed in rounds (writes into the middle
   of big files, appends, truncations, deletions, creations, renames, symlinks); after each
   round the filesystem is frozen (`fsfreeze`), a snapshot taken and the tree's manifest
   (path → file size and sha256, symlink target, directory) saved. Every snapshot is then
   exported, attached read-only, fsck'd, mounted `ro,noload` and must hold exactly its
   manifest's tree. A clone of one snapshot is mounted read-write beside the still-mounted
   origin; both are changed and must not see each other's changes (after fsck and a
   remount). Deleting a middle snapshot, then the clone's base, must leave every other
   version (the volume and the clone too) byte-identical.

2. kill -9 in a snapshot storm: one thread writes self-describing 4-64 KiB blocks over NBD,
   each with its own write id, flushing often; another takes snapshots back to back through
   the CLI. The server is SIGKILLed at a seeded random moment, `strata check` must find its
   metadata undamaged, and after the restart: every snapshot whose create returned is
   listed; every listed one (also those the kill cut) reads, for each 4 KiB granule, a write
   that its create allows: not issued after the create returned, no older than the newest
   write to that granule acknowledged before the create started; and all of them together
   are one instant of the (sequential) write stream: every write older than the newest one
   it shows is in it, and that one whole.
   The volume holds every write a flush or a snapshot made durable. Snapshots verified once
   must read the same after every later crash and a clean restart.

3. A write across two extents is in a snapshot whole or not at all (it was not, before the
   pool's request gate: the write took its extents' lock stripes one after the other, and
   the snapshot's quiesce could fall in between).

Environment:
    STRATA_VERSIONS_SEED=<n>     replay a seed (the files of 1, the storms of 2; printed at
                                 the start and in every failure of 2)
    STRATA_VERSIONS_KILLS=<k>    kills in the storm test (default 4)
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
import random
import shutil
import signal
import stat
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbd
import pytest

from harness import (MiB, STRATA_BIN, Disk, Export, Layer, ServerSpec, Volume, assert_fsck_clean, block_device,
                     close_handle, export_sha256, mounted, nbd_handle, requires_strata, run, sha256_file)
from test_ext4 import _can_do_block_devices
from test_snapshots import listed, snapshot

pytestmark = requires_strata()

EXTENT = 64 * 1024
_SEED_ENV = os.environ.get("STRATA_VERSIONS_SEED")
SEED = int(_SEED_ENV) if _SEED_ENV else int.from_bytes(os.urandom(4), "little")
ITERATIONS = int(os.environ.get("STRATA_VERSIONS_KILLS", "4"))


def replay_line(test: str) -> str:
    return (f"STRATA_VERSIONS_SEED={SEED} STRATA_VERSIONS_KILLS={ITERATIONS} "
            f"/usr/bin/python3 -m pytest tests/integration/test_snapshots_ext4.py -k {test}")


def pool_spec(volume_size: int, disk_size: int) -> ServerSpec:
    return ServerSpec(
        disks=[Disk("d0", disk_size)],
        layers=[Layer(extent=EXTENT, volumes=[Volume("v", volume_size)])],
        exports=[Export("v", "pool/v")],
    )


# ---------------------------------------------------------------------------
# 1. ext4 through versions


def _block_devices_and_fsfreeze() -> str | None:
    return _can_do_block_devices() or (None if shutil.which("fsfreeze") else "fsfreeze missing")


FS_VOLUME = 128 * MiB
ROUNDS = 4  # snapshots s0..s3
CLONED = "s1"  # the snapshot cloned; s2 (a middle one that nothing else reads) is deleted first
MKFS = ["mkfs.ext4", "-q", "-F", "-b", "4096",
        # inode tables and journal written now: no lazy-init thread writing behind the test
        "-E", "lazy_itable_init=0,lazy_journal_init=0"]


def manifest(root: Path) -> dict[str, tuple]:
    """Everything under `root`: path → ("dir",), ("link", target) or ("file", size, sha256)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir",)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", st.st_size, sha256_file(p))
            else:
                out[rel] = ("other", stat.S_IFMT(st.st_mode))
    return out


def manifest_diff(want: dict, got: dict) -> str:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    changed = sorted(p for p in set(want) & set(got) if want[p] != got[p])
    lines = [f"{len(missing)} missing, {len(extra)} extra, {len(changed)} differ"]
    lines += [f"  missing {p}: {want[p]}" for p in missing[:10]]
    lines += [f"  extra   {p}: {got[p]}" for p in extra[:10]]
    lines += [f"  differs {p}: want {want[p]}, got {got[p]}" for p in changed[:10]]
    return "\n".join(lines)


def assert_tree(root: Path, want: dict, what: str) -> None:
    got = manifest(root)
    assert got == want, f"{what}: the tree is not the expected one: {manifest_diff(want, got)}"


def small_size(rng: random.Random) -> int:
    return rng.choice([0, 1, 511, 4095, 4096, 4097, rng.randrange(1, 16 * 1024), rng.randrange(1, 128 * 1024)])


def populate(root: Path, rng: random.Random) -> None:
    """~320 files in 20 folders (~20 MiB): mostly small, some medium, four of 2-4 MiB."""
    dirs = [root]
    for i in range(20):
        d = rng.choice(dirs) / f"d{i:02d}"
        d.mkdir()
        dirs.append(d)
    for i in range(300):
        size = small_size(rng) if rng.random() < 0.9 else rng.randrange(128 * 1024, 512 * 1024)
        (rng.choice(dirs) / f"f{i:03d}").write_bytes(rng.randbytes(size))
    for i in range(4):
        (root / f"big{i}.bin").write_bytes(rng.randbytes(rng.randrange(2 * MiB, 4 * MiB)))
    for i in range(6):
        (rng.choice(dirs) / f"link{i}").symlink_to(f"../target-{i}" if i % 2 else f"f{i:03d}")
    (root / "empty-dir").mkdir()


def files_in(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def overwrite_middle(path: Path, rng: random.Random) -> None:
    size = path.stat().st_size
    n = rng.randrange(1, 200 * 1024)
    with open(path, "r+b") as f:
        f.seek(rng.randrange(size // 4, size // 2))
        f.write(rng.randbytes(n))


def mutate(root: Path, rng: random.Random, tag: str) -> None:
    """One round of changes of every kind a filesystem makes."""
    files = files_in(root)
    for p in rng.sample([p for p in files if p.stat().st_size > MiB], 2):
        overwrite_middle(p, rng)  # in place, unaligned: partial blocks of shared extents
    for p in rng.sample(files, 10):
        with open(p, "ab") as f:
            f.write(rng.randbytes(rng.randrange(1, 100 * 1024)))
    small = [p for p in files if p.stat().st_size < MiB]
    for p in rng.sample(small, 15):
        p.unlink()
    dirs = sorted(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()) + [root]
    for i in range(20):
        (rng.choice(dirs) / f"{tag}-new{i:02d}").write_bytes(rng.randbytes(small_size(rng)))
    (root / f"{tag}-big.bin").write_bytes(rng.randbytes(rng.randrange(MiB, 3 * MiB)))
    survivors = [p for p in files_in(root) if p.stat().st_size < MiB]
    for i, p in enumerate(rng.sample(survivors, 5)):
        p.rename(rng.choice(dirs) / f"{tag}-moved{i}")
    d = rng.choice([d for d in dirs if d != root])
    d.rename(d.with_name(f"{d.name}-{tag}"))  # a whole folder, with what is in it
    truncated = rng.choice(files_in(root))
    os.truncate(truncated, truncated.stat().st_size // 3)
    grown = rng.choice(files_in(root))
    os.truncate(grown, grown.stat().st_size + 3 * MiB + 123)  # a hole at the end
    (root / f"{tag}-link").symlink_to(rng.choice(files_in(root)).relative_to(root))
    links = sorted(p for p in root.rglob("*") if p.is_symlink())
    rng.choice(links).unlink()


def take_snapshot(srv, mnt: Path, name: str) -> None:
    """sync, freeze the filesystem (its image on the volume is then consistent and its journal
    empty), take the snapshot, thaw. Thawed whatever happens: a frozen mount blocks the
    unmount at teardown."""
    run(["sync"])
    run(["fsfreeze", "-f", mnt])
    try:
        out = snapshot(srv, "create", "pool/v", name).stdout
    finally:
        run(["fsfreeze", "-u", mnt])
    assert f"snapshot pool/v@{name} taken" in out, out


def check_snapshot_tree(srv, workdir: Path, name: str, want: dict, tag: str) -> None:
    """Exported snapshot `name` attached read-only, fsck'd and mounted: its tree is `want`.
    `noload`: a read-only device cannot take a journal replay (the freeze left none)."""
    with block_device(srv, workdir, tag, export=f"pool/v@{name}", read_only=True) as loop:
        assert_fsck_clean(loop, f"snapshot {name}")
        with mounted(loop, workdir / f"mnt-{tag}", "ro,noload") as mnt:
            assert_tree(mnt / "tree", want, f"snapshot {name}")


def diverge(root: Path, before: dict, shared: str, rng: random.Random, tag: str) -> dict:
    """Changes made on one side of a clone: a new file, a rewrite in the middle of the big file
    `shared` both sides have, a deletion. Returns the tree expected after them, computed from
    the bytes written, not read back."""
    want = dict(before)
    data = rng.randbytes(MiB + 17)
    (root / f"only-{tag}.bin").write_bytes(data)
    want[f"only-{tag}.bin"] = ("file", len(data), hashlib.sha256(data).hexdigest())
    content = bytearray((root / shared).read_bytes())
    patch = rng.randbytes(300 * 1024)
    at = len(content) // 3 + rng.randrange(4096)
    # A write past the end leaves a hole: zeros up to `at` (a slice assignment would append).
    content.extend(bytes(max(0, at - len(content))))
    content[at:at + len(patch)] = patch
    with open(root / shared, "r+b") as f:
        f.seek(at)
        f.write(patch)
    want[shared] = ("file", len(content), hashlib.sha256(content).hexdigest())
    victim = rng.choice(sorted(p for p, e in before.items() if e[0] == "file" and p != shared))
    (root / victim).unlink()
    del want[victim]
    return want


@pytest.mark.skipif(_block_devices_and_fsfreeze() is not None, reason=str(_block_devices_and_fsfreeze()))
def test_ext4_snapshots_mount_as_taken_clone_diverges_deletes_spare_the_rest(server_factory, workdir):
    srv = server_factory(pool_spec(FS_VOLUME, 512 * MiB))
    rng = random.Random(SEED)
    print(f"\nseed {SEED} (STRATA_VERSIONS_SEED={SEED} replays the files)")
    manifests: dict[str, dict] = {}
    with block_device(srv, workdir, "origin", export="v") as loop:
        run(MKFS + [loop], timeout=120)
        with mounted(loop, workdir / "mnt-origin") as mnt:
            tree = mnt / "tree"
            tree.mkdir()
            populate(tree, rng)
            for r in range(ROUNDS):
                if r:
                    mutate(tree, rng, f"r{r}")
                name = f"s{r}"
                take_snapshot(srv, mnt, name)
                manifests[name] = manifest(tree)
            # The volume moves on past its last snapshot, so that no snapshot reads as the
            # volume: a snapshot that read the live volume fails below.
            mutate(tree, rng, "live")
            run(["sync"])
            live = manifest(tree)
            trees = list(manifests.values()) + [live]
            assert all(a != b for i, a in enumerate(trees) for b in trees[i + 1:]), "rounds changed nothing"
            assert len(live) > 300 and sum(e[1] for e in live.values() if e[0] == "file") > 16 * MiB

            assert sorted(listed(srv)) == sorted(manifests)
            for name, want in manifests.items():
                out = snapshot(srv, "export", "pool/v", name).stdout
                assert "read-only" in out, out
                check_snapshot_tree(srv, workdir, name, want, f"snap-{name}")
            digests = {name: export_sha256(srv, f"pool/v@{name}") for name in manifests}

            # A clone of a snapshot, mounted read-write beside the still-mounted origin; each
            # side changes its own copy of the same files.
            out = snapshot(srv, "clone", "pool/v", CLONED, "c").stdout
            assert 'exported as "pool/c"' in out, out
            # The biggest file both have (the smaller of its two sizes): each side rewrites part
            # of it.
            size, shared = max((min(e[1], manifests[CLONED][p][1]), p) for p, e in live.items()
                               if e[0] == "file" and manifests[CLONED].get(p, ("",))[0] == "file")
            assert size > MiB
            with block_device(srv, workdir, "clone", export="pool/c") as cloop:
                with mounted(cloop, workdir / "mnt-clone") as cmnt:
                    assert_tree(cmnt / "tree", manifests[CLONED], "the clone, as mounted")
                    want_clone = diverge(cmnt / "tree", manifests[CLONED], shared, rng, "clone")
                    want_origin = diverge(tree, live, shared, rng, "origin")
                    run(["sync"])
                    # Read back from the devices, not from what the page cache kept of the writes.
                    Path("/proc/sys/vm/drop_caches").write_text("3")
                    assert_tree(cmnt / "tree", want_clone, "the clone after its changes")
                    assert_tree(tree, want_origin, "the origin after its changes")
                assert_fsck_clean(cloop, "the clone")
                with mounted(cloop, workdir / "mnt-clone-ro", "ro") as cmnt:
                    assert_tree(cmnt / "tree", want_clone, "the clone, remounted")
        assert_fsck_clean(loop, "the origin")
        with mounted(loop, workdir / "mnt-origin-ro", "ro") as mnt:
            assert_tree(mnt / "tree", want_origin, "the origin, remounted")

        # Neither side's writes reached a snapshot, the cloned one included.
        for name, digest in digests.items():
            assert export_sha256(srv, f"pool/v@{name}") == digest, f"snapshot {name} changed"
        digests["volume"] = export_sha256(srv, "v")
        digests["clone"] = export_sha256(srv, "pool/c")

        # A middle snapshot nothing is based on goes (what only it reads is freed), then the
        # clone's base (which the clone keeps reading): every other version reads as before.
        for gone in ("s2", CLONED):
            out = snapshot(srv, "delete", "pool/v", gone).stdout
            assert f"deleted snapshot pool/v@{gone}" in out, out
            del digests[gone]
            assert f"pool/v@{gone}" not in [e["name"] for e in srv.status()["exports"]]
            assert sorted(listed(srv)) == sorted(n for n in digests if n.startswith("s"))
            for name, digest in digests.items():
                export = {"volume": "v", "clone": "pool/c"}.get(name, f"pool/v@{name}")
                assert export_sha256(srv, export) == digest, f"{name} changed when snapshot {gone} was deleted"
    check_snapshot_tree(srv, workdir, "s3", manifests["s3"], "s3-at-last")  # and still mounts as taken


COMPACT_ROUNDS = 6  # snapshots c0..c5; all but the newest are compacted


@pytest.mark.skipif(_block_devices_and_fsfreeze() is not None, reason=str(_block_devices_and_fsfreeze()))
def test_ext4_versions_compacted_read_as_taken_and_save_space(server_factory, workdir):
    """Clotho's differential compaction on a real file system: ext4 edited in rounds with a
    snapshot after each; every snapshot but the newest compacted (each against the next);
    every snapshot still reads byte-identical and mounts as its tree was; the space saved is
    reported; uncompacting one gives the same bytes back."""
    srv = server_factory(pool_spec(FS_VOLUME, 512 * MiB))
    rng = random.Random(SEED ^ 0xC0)
    names = [f"c{r}" for r in range(COMPACT_ROUNDS)]
    manifests: dict[str, dict] = {}
    with block_device(srv, workdir, "origin", export="v") as loop:
        run(MKFS + [loop], timeout=120)
        with mounted(loop, workdir / "mnt-origin") as mnt:
            tree = mnt / "tree"
            tree.mkdir()
            populate(tree, rng)
            for r, name in enumerate(names):
                if r:
                    mutate(tree, rng, f"c{r}")
                take_snapshot(srv, mnt, name)
                manifests[name] = manifest(tree)
            mutate(tree, rng, "live")
            run(["sync"])
    for name in names:
        snapshot(srv, "export", "pool/v", name)
    digests = {name: export_sha256(srv, f"pool/v@{name}") for name in names}

    saved = 0
    rows = []
    # Newest first: each is made against the next, itself maybe compacted already.
    for name in reversed(names[:-1]):
        out = snapshot(srv, "compact", "pool/v", name).stdout
        assert f"compacted pool/v@{name} against" in out, out
        rows.append(out.strip())
        saved_text = out.rsplit(";", 1)[1].strip()
        assert saved_text.endswith("saved"), out
        saved += not saved_text.startswith(("0 ", "-"))
    print("\n" + "\n".join(rows))
    assert saved > 0, "compaction saved nothing on any snapshot:\n" + "\n".join(rows)

    listing = snapshot(srv, "list", "pool/v").stdout
    for name in names[:-1]:
        line = next(l for l in listing.splitlines() if f"@{name} " in l)
        assert " against " in line, listing
    for name, digest in digests.items():
        assert export_sha256(srv, f"pool/v@{name}") == digest, f"compaction changed snapshot {name}"
    check_snapshot_tree(srv, workdir, names[0], manifests[names[0]], "compacted-first")
    check_snapshot_tree(srv, workdir, names[2], manifests[names[2]], "compacted-middle")

    # What cannot be done to a compacted snapshot is refused with the way out.
    r = snapshot(srv, "rollback", "pool/v", names[1], check=False)
    assert r.returncode != 0 and "uncompact it" in r.stdout + r.stderr, r
    out = snapshot(srv, "uncompact", "pool/v", names[2]).stdout
    assert f"uncompacted pool/v@{names[2]}" in out, out
    for name, digest in digests.items():
        assert export_sha256(srv, f"pool/v@{name}") == digest, f"uncompaction changed snapshot {name}"

    # After a restart every version still reads the same.
    srv.restart()
    for name in names:
        snapshot(srv, "export", "pool/v", name)
    for name, digest in digests.items():
        assert export_sha256(srv, f"pool/v@{name}") == digest, f"snapshot {name} changed across a restart"


# ---------------------------------------------------------------------------
# 2. kill -9 during a snapshot storm

GRANULE = 4096
REGION = 4 * MiB  # written over and over: a granule sees many writes between snapshots
GRANULES = REGION // GRANULE
MAGIC = b"SNAPSTRM"
HEAD = struct.Struct("<8sQQQ")  # magic, seed, write id, granule


def granule_bytes(wid: int, g: int) -> bytes:
    return HEAD.pack(MAGIC, SEED, wid, g) * (GRANULE // HEAD.size)


def decode(data: bytes, g: int):
    """The write id a granule holds, 0 for zeros (never written), or a description of garbage."""
    if data == bytes(GRANULE):
        return 0
    magic, seed, wid, at = HEAD.unpack_from(data)
    if magic == MAGIC and seed == SEED and at == g and data == granule_bytes(wid, g):
        return wid
    return f"garbage (first 32 bytes {data[:32].hex()})"


@dataclass
class Write:
    wid: int
    first: int  # granule
    count: int
    issued: float  # time.monotonic() taken before the request was sent...
    acked: float | None = None  # ...and after its reply came; None: cut by the kill


@dataclass
class Create:
    name: str
    started: float  # before the CLI was started
    returned: float | None = None  # after it exited 0; None: failed (cut by the kill)
    output: str = ""


class Storm:
    """One iteration: a writer and a snapshot taker until the kill, with their logs.

    The times are taken on the safe side of each event (a start before it, an end after it),
    so "acknowledged before the create started" and "issued after it returned" never claim
    more than happened."""

    def __init__(self, srv, iteration: int, first_wid: int, rng: random.Random):
        self.srv = srv
        self.iteration = iteration
        self.next_wid = first_wid
        self.rng = random.Random(rng.random())
        self.writes: list[Write] = []
        self.flushes: list[tuple[float, float]] = []  # (issued, acked) of acknowledged flushes
        self.creates: list[Create] = []
        self.killed = threading.Event()
        self.errors: list[str] = []  # failures while the server was running

    def write_loop(self) -> None:
        rng = self.rng
        h = None
        try:
            h = self.srv.connect(export="v")
            while not self.killed.is_set():
                count = rng.randint(1, 16)
                w = Write(self.next_wid, rng.randrange(GRANULES - count + 1), count, 0.0)
                self.next_wid += 1
                data = b"".join(granule_bytes(w.wid, g) for g in range(w.first, w.first + count))
                self.writes.append(w)  # logged first: a write cut by the kill may have landed
                w.issued = time.monotonic()
                h.pwrite(data, w.first * GRANULE)
                w.acked = time.monotonic()
                if rng.random() < 0.3:
                    issued = time.monotonic()
                    h.flush()
                    self.flushes.append((issued, time.monotonic()))
        except BaseException as e:  # reported by the main thread
            if not (self.killed.is_set() and isinstance(e, nbd.Error)):
                self.errors.append(f"the writer failed while the server ran: {e!r}")
        finally:
            if h is not None:
                close_handle(h)

    def snapshot_loop(self) -> None:
        n = 0
        while not self.killed.is_set():
            c = Create(f"i{self.iteration}-{n:04d}", time.monotonic())
            n += 1
            self.creates.append(c)
            r = snapshot(self.srv, "create", "pool/v", c.name, check=False)
            c.output = r.stdout + r.stderr
            if r.returncode == 0:
                c.returned = time.monotonic()
            elif not self.killed.is_set():
                self.errors.append(f"snapshot create {c.name} failed while the server ran: {c.output}")
                return

    def run_until_killed(self, after: float, creates: int, then: float) -> None:
        """SIGKILL the server `after` seconds, or `then` seconds after the start of the
        `creates`th create if that comes first (a fast machine takes snapshots faster than
        they are checked; a kill soon after a create started may cut it)."""
        threads = [threading.Thread(target=self.write_loop), threading.Thread(target=self.snapshot_loop)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + after
        while time.monotonic() < deadline and len(self.creates) < creates:
            time.sleep(0.002)
        if len(self.creates) >= creates:
            time.sleep(then)
        self.killed.set()  # before the kill: errors from now on are the kill's
        rc = self.srv.crash()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a client hangs after the server was killed"
        assert rc == -signal.SIGKILL, f"the server exited {rc} before it was killed"


class Granules:
    """What each granule of the region may hold: its value when the iteration started (read
    back and checked after the last restart) and the writes of this iteration to it, oldest
    first. One synchronous writer: each write is issued after the one before was acked."""

    def __init__(self):
        self.base = [0] * GRANULES
        self.start_iteration([])

    def start_iteration(self, writes: list[Write]) -> None:
        self.history: list[list[Write]] = [[] for _ in range(GRANULES)]
        for w in writes:
            for g in range(w.first, w.first + w.count):
                self.history[g].append(w)
        # Both ascend along a history (one write at a time): searched by bisection.
        self.wids = [[w.wid for w in h] for h in self.history]
        self.acks = [[math.inf if w.acked is None else w.acked for w in h] for h in self.history]

    def newest_acked_before(self, g: int, t: float) -> int | None:
        """Index in history[g] of the newest write acknowledged before time t."""
        i = bisect.bisect_left(self.acks[g], t) - 1
        return i if i >= 0 else None

    def newest_up_to(self, g: int, wid: int) -> int:
        """Index in history[g] of the newest write numbered wid or lower, -1 for none."""
        return bisect.bisect_right(self.wids[g], wid) - 1

    def index_of(self, g: int, wid) -> int | None:
        """-1 for the base value, the index in history[g], or None: not a value g ever had."""
        i = self.newest_up_to(g, wid)
        if i >= 0 and self.wids[g][i] == wid:
            return i
        return -1 if wid == self.base[g] else None

    def describe(self, g: int) -> str:
        ws = ", ".join(f"#{w.wid} (granules {w.first}..{w.first + w.count - 1}, issued {w.issued:.4f}, "
                       f"acked {'-' if w.acked is None else f'{w.acked:.4f}'})" for w in self.history[g])
        return f"base #{self.base[g]}; writes: {ws or 'none'}"


def read_region(srv, export: str) -> bytes:
    with nbd_handle(srv, export=export) as h:
        return h.pread(REGION, 0)


def decode_region(data: bytes) -> list:
    return [decode(data[g * GRANULE:(g + 1) * GRANULE], g) for g in range(GRANULES)]


def snapshot_problems(model: Granules, c: Create, shown: list) -> list[str]:
    """What snapshot `c` may hold, per granule: (a) no write issued after its create returned,
    (b) no write older than the newest one acknowledged before its create started, (c) one
    instant of the write stream: with k the newest write it shows, each granule shows the
    newest write up to k (k itself whole: see
    test_a_write_across_two_extents_is_in_a_snapshot_whole_or_not_at_all)."""
    returned = float("inf") if c.returned is None else c.returned
    at = [model.index_of(g, wid) if isinstance(wid, int) else None for g, wid in enumerate(shown)]
    newest = max((model.history[g][i].wid for g, i in enumerate(at) if i is not None and i >= 0), default=0)
    problems = []
    for g, wid in enumerate(shown):
        i = at[g]
        if i is None:
            what = wid if isinstance(wid, str) else f"#{wid}, never written there (or lost in an earlier crash)"
            problems.append(f"granule {g}: {what}; {model.describe(g)}")
            continue
        if i >= 0 and model.history[g][i].issued > returned:
            problems.append(f"granule {g}: #{wid} was issued after the create returned; {model.describe(g)}")
        floor = model.newest_acked_before(g, c.started)
        if floor is not None and i < floor:
            problems.append(f"granule {g}: #{wid} is older than #{model.history[g][floor].wid}, acknowledged "
                            f"before the create started; {model.describe(g)}")
        upto = model.newest_up_to(g, newest)
        if i == upto:
            continue
        problems.append(f"granule {g}: #{wid}, but the snapshot shows write #{newest}, so here it must show "
                        f"the newest write up to that one (a later write is in the snapshot, an earlier one "
                        f"not); {model.describe(g)}")
    return problems


def volume_problems(model: Granules, storm: Storm, listed_creates: list[Create], shown: list) -> list[str]:
    """After the crash the volume holds, per granule, the newest write made durable before it
    (by an acknowledged flush, or by a snapshot create, which flushes all that was acknowledged
    before it started) or a later one."""
    durable = max([issued for issued, _ in storm.flushes] + [c.started for c in listed_creates], default=0.0)
    problems = []
    for g, wid in enumerate(shown):
        i = model.index_of(g, wid) if isinstance(wid, int) else None
        floor = model.newest_acked_before(g, durable)
        if i is None:
            what = wid if isinstance(wid, str) else f"#{wid}, never written there (or lost in an earlier crash)"
            problems.append(f"granule {g}: {what}; {model.describe(g)}")
        elif floor is not None and i < floor:
            problems.append(f"granule {g}: #{wid}, but #{model.history[g][floor].wid} was made durable; "
                            f"{model.describe(g)}")
    return problems


@pytest.mark.timeout(60 + 30 * ITERATIONS)
def test_kill9_during_snapshot_storm(server_factory, request):
    test = request.node.name
    print(f"\n{test}: seed {SEED}, {ITERATIONS} iterations; replay: {replay_line(test)}")
    rng = random.Random(SEED)
    srv = server_factory(pool_spec(64 * MiB, 2048 * MiB))  # ~0.5 MiB of extents per snapshot
    model = Granules()
    verified: dict[str, str] = {}  # snapshot → sha256 of its region, once checked
    attempted: set[str] = set()
    next_wid = 1
    stats = []

    def fail(msg: str) -> None:
        pytest.fail(f"{msg}\nseed {SEED}; replay with:\n  {replay_line(test)}", pytrace=False)

    for it in range(ITERATIONS):
        storm = Storm(srv, it, next_wid, rng)
        storm.run_until_killed(rng.uniform(1.0, 3.0), rng.randint(50, 150), rng.uniform(0.0, 0.01))
        if storm.errors:
            fail(f"iteration {it}: " + "; ".join(storm.errors))
        next_wid = storm.next_wid
        attempted |= {c.name for c in storm.creates}
        model.start_iteration(storm.writes)
        r = run([STRATA_BIN, "check", srv.disk_file("d0")], check=False, timeout=60)
        if r.returncode != 0:
            fail(f"iteration {it}: strata check after kill -9 exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        srv.start()

        names = list(listed(srv))
        gone = [c.name for c in storm.creates if c.returned is not None and c.name not in names]
        if gone:
            fail(f"iteration {it}: snapshots whose create returned success are not listed after kill -9: {gone}")
        unknown = [n for n in names if n not in attempted]
        lost = [n for n in verified if n not in names]
        if unknown or lost:
            fail(f"iteration {it}: listed but never asked for: {unknown}; verified earlier, now gone: {lost}")

        by_name = {c.name: c for c in storm.creates}
        listed_now = [by_name[n] for n in names if n in by_name]
        for c in listed_now:
            snapshot(srv, "export", "pool/v", c.name)
            data = read_region(srv, f"pool/v@{c.name}")
            shown = decode_region(data)
            problems = snapshot_problems(model, c, shown)
            if problems:
                fail(f"iteration {it}: snapshot {c.name} (create started {c.started:.4f}, returned "
                     f"{c.returned if c.returned is None else f'{c.returned:.4f}'}) holds what its create does not "
                     f"allow in {len(problems)} places; the first ones:\n  " + "\n  ".join(problems[:8]))
            verified[c.name] = hashlib.sha256(data).hexdigest()

        shown = decode_region(read_region(srv, "v"))
        problems = volume_problems(model, storm, listed_now, shown)
        if problems:
            fail(f"iteration {it}: the volume lost durable writes in {len(problems)} places; the first ones:\n  "
                 + "\n  ".join(problems[:8]))
        model.base = shown
        cut = [c for c in storm.creates if c.returned is None]
        stats.append(f"{len(storm.writes)} writes, {len(storm.flushes)} flushes, {len(storm.creates) - len(cut)} "
                     f"snapshots returned, {sum(c.name in names for c in cut)} of {len(cut)} cut by the kill listed")

    # Every snapshot verified after its own crash reads the same after all the later ones and
    # a clean restart (which also ends the exports of the last iteration's).
    srv.restart()
    for name, digest in verified.items():
        snapshot(srv, "export", "pool/v", name)
        if hashlib.sha256(read_region(srv, f"pool/v@{name}")).hexdigest() != digest:
            fail(f"snapshot {name} changed across later crashes")
    print("\n".join(f"iteration {i}: {s}" for i, s in enumerate(stats)))


BOUNDARIES = 32  # 8 KiB writes across the first 32 extent boundaries, in turn
WRITERS = 4  # clients, each with its own boundaries: four writes in flight at each snapshot
SNAPSHOTS = 60  # at most; the test stops at the first snapshot holding part of a write


def torn_boundaries(data: bytes) -> list[str]:
    """The boundaries where the granules either side hold different writes."""
    torn = []
    for b in range(1, BOUNDARIES + 1):
        g = b * EXTENT // GRANULE - 1  # the last granule before the boundary
        before, after = (decode(data[i * GRANULE:(i + 1) * GRANULE], i) for i in (g, g + 1))
        if before != after:
            torn.append(f"granule {g} (end of extent {b - 1}) holds write #{before}, granule {g + 1} "
                        f"(start of extent {b}) write #{after}")
    return torn


def test_a_write_across_two_extents_is_in_a_snapshot_whole_or_not_at_all(server_factory):
    """A snapshot is one instant: a write in flight then is in it whole or not at all, as the
    pool's design says ("a write belongs wholly to the epoch before or wholly to the epoch
    after", crates/thin/src/snapshot.rs). Clients write 8 KiB across extent boundaries, each
    with its own write ids, while snapshots are taken back to back; in each snapshot both
    halves of every boundary must hold the same write."""
    srv = server_factory(pool_spec(64 * MiB, 256 * MiB))
    stop = threading.Event()
    writes = [0] * WRITERS
    errors = []

    def write_loop(k: int) -> None:
        try:
            with nbd_handle(srv, export="v") as h:
                while not stop.is_set():
                    for b in range(1 + k, BOUNDARIES + 1, WRITERS):
                        writes[k] += 1
                        wid = writes[k] * WRITERS + k  # unique across the writers
                        g = b * EXTENT // GRANULE - 1
                        h.pwrite(granule_bytes(wid, g) + granule_bytes(wid, g + 1), g * GRANULE)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    writers = [threading.Thread(target=write_loop, args=(k,)) for k in range(WRITERS)]
    for t in writers:
        t.start()
    torn = []
    try:
        for i in range(SNAPSHOTS):
            snapshot(srv, "create", "pool/v", f"s{i}")
            snapshot(srv, "export", "pool/v", f"s{i}")
            torn = [f"snapshot s{i}: {t}" for t in torn_boundaries(read_region(srv, f"pool/v@s{i}"))]
            if torn or errors:
                break
            # Each snapshot pins about 4 MiB of the writers' extents: checked, it goes.
            snapshot(srv, "delete", "pool/v", f"s{i}")
    finally:
        stop.set()
        for t in writers:
            t.join(60)
    if errors:
        pytest.fail(f"a writer failed: {errors}")
    assert not torn, "a snapshot holds part of a write:\n  " + "\n  ".join(torn)
    if min(writes) <= SNAPSHOTS:  # a pass must not come from writers that hardly wrote
        pytest.fail(f"the writers hardly wrote while the snapshots were taken: {writes}")
