"""The `stage` layer (docs/layers/stage.md) served over NBD and driven by clients Strata did not
write: fio verifies random 4 KiB writes while watermark destages move them to a slow child
(a `delay` over a file) and large writes go direct; qemu-io writes flushed patterns and
qemu-img compares them with a reference file after a kill -9 in the middle of a destage and
after a clean restart; nbdinfo and qemu-img convert see the device; and an administrator's
mistakes (a missing fast child, damaged metadata, the children swapped, a fixed field
changed) are refused, naming the stage, never formatted over nor served as zeros."""

from __future__ import annotations

import json
import random
import subprocess
import time

import pytest

from harness import MiB, STRATA_BIN, Disk, Export, Layer, ServerSpec, run
from test_hierarchy import layer_node, strata
from test_nbd_tools import nbdinfo_json
from test_qemu_tools import make_image
from test_raid5_grow import fio
from test_thin import check

STAGE = "staged"
BLOCK = 4096
LABEL = 64 * 1024  # the hierarchy label at the start of every disk under a layer
FLASH = 8 * MiB
DISK = 64 * MiB
# The device has the slow child's size (64 MiB less the label) rounded down to 1 MiB ranges;
# the log is what the fast child keeps after its label and its 1 MiB metadata region.
SIZE = 63 * MiB
SLOTS = (FLASH - LABEL - MiB) // BLOCK


def stage_spec(slow_latency: str | None = None, plain: bool = False, **options) -> ServerSpec:
    """A stage `staged` over disks `flash` (8 MiB) and `disk` (64 MiB), exported as `vol`;
    with `slow_latency`, the slow child is a `delay` layer over `disk` (a slow disk); with
    `plain`, a disk `other` exported as `plain` keeps the server up when the stage is refused."""
    disks = [Disk("flash", FLASH), Disk("disk", DISK)]
    layers, slow = [], "disk"
    if slow_latency:
        layers.append(Layer(name="slow", kind="delay", children=["disk"], options={"write-latency": slow_latency}))
        slow = "slow"
    layers.append(Layer(name=STAGE, kind="stage", children=["flash", slow], options=options))
    exports = [Export("vol", STAGE)]
    if plain:
        disks.append(Disk("other", 4 * MiB))
        exports.append(Export("plain", "other"))
    return ServerSpec(disks=disks, layers=layers, exports=exports)


def detail(srv) -> dict:
    return dict(layer_node(srv, STAGE)["detail"])


def counters(srv, *names: str) -> list[int]:
    d = detail(srv)
    return [int(d[name]) for name in names]


def backlog(srv) -> int:
    """Staged blocks, from `backlog = N blocks staged in E extents`."""
    return int(detail(srv)["backlog"].split()[0])


def wait_backlog_at_most(srv, blocks: int, timeout: float = 30) -> None:
    """Polls until the background destages have brought the backlog down to `blocks`."""
    deadline = time.monotonic() + timeout
    while backlog(srv) > blocks:
        assert time.monotonic() < deadline, f"backlog still above {blocks} after {timeout} s: {detail(srv)}"
        time.sleep(0.02)


def destage_now(srv) -> dict:
    """`strata call staged destage`: everything staged goes to the slow child; its answer."""
    return json.loads(strata("call", "--data-dir", srv.data_dir, STAGE, "destage", "--json").stdout)


class Reference:
    """What the device must read: a file of its size that every write is applied to."""

    def __init__(self, path):
        self.path = path
        self.data = bytearray(SIZE)

    def qemu_io(self, srv, writes) -> None:
        """Writes [(offset, length, pattern byte)] through qemu-io (write-back cache: no
        flush per write), then one FLUSH; applies them here and saves the file."""
        cmds = []
        for offset, length, byte in writes:
            cmds += ["-c", f"write -P {byte} {offset} {length}"]
            self.data[offset:offset + length] = bytes([byte]) * length
        run(["qemu-io", "-f", "raw", "-t", "writeback", *cmds, "-c", "flush", srv.uri()])
        self.path.write_bytes(self.data)

    def assert_served(self, srv) -> None:
        r = run(["qemu-img", "compare", "-f", "raw", "-F", "raw", self.path, srv.uri()], check=False)
        assert r.returncode == 0 and "Images are identical" in r.stdout, r.stdout + r.stderr


def scattered(seed: int, count: int, blocks=range(SIZE // BLOCK)) -> list[tuple[int, int, int]]:
    """`count` distinct 4 KiB blocks all over the device, each with its own pattern byte."""
    rng = random.Random(seed)
    return [(b * BLOCK, BLOCK, rng.randrange(1, 256)) for b in rng.sample(blocks, count)]


def test_fio_verifies_through_watermark_destages_and_large_writes_go_direct(server_factory, workdir):
    srv = server_factory(stage_spec(slow_latency="1ms", trigger="watermark", high=50, low=10))
    # 6,000 random 4 KiB writes over 32 MiB (8,192 blocks, 4.6 times the log): the log passes
    # its high watermark again and again. fio then reads every block back and checks it.
    small = dict(rw="randwrite", bs="4k", iodepth=16, size="32m", number_ios=6000, verify="crc32c",
                 do_verify=1, verify_fatal=1, randrepeat=1, randseed=7)
    fio(srv, workdir, "small", **small)
    staged, destages, destaged, batches, failures, direct = counters(
        srv, "staged writes", "destages", "destaged blocks", "batches", "destage failures", "direct writes")
    assert staged == 6000 and direct == 0, detail(srv)
    assert destages > 0 and destaged > 0 and batches >= destages and failures == 0, detail(srv)
    wait_backlog_at_most(srv, SLOTS // 2)  # the watermark's destages run in the background
    # What is still staged goes now; then every block is read from the slow child.
    left = backlog(srv)
    answer = destage_now(srv)
    assert answer["blocks"] == left and answer["skipped"] == 0, answer
    assert backlog(srv) == 0, detail(srv)
    fio(srv, workdir, "small", verify_only=1, **small)

    # 256 KiB writes (>= the 168 KiB threshold) go to the slow child directly, none staged.
    large = dict(rw="write", bs="256k", iodepth=4, offset="32m", size="16m", verify="crc32c", do_verify=1,
                 verify_fatal=1)
    fio(srv, workdir, "large", **large)
    staged_after, direct, direct_blocks = counters(srv, "staged writes", "direct writes", "direct blocks")
    assert staged_after == staged, detail(srv)
    assert (direct, direct_blocks) == (16 * MiB // (256 * 1024), 16 * MiB // BLOCK), detail(srv)
    assert backlog(srv) == 0, detail(srv)


def test_kill9_in_the_middle_of_a_destage_loses_nothing_flushed(server_factory, workdir):
    # A slow child that takes 20 ms per write, given 8 at a time (`delay` overlaps concurrent
    # requests, so a whole batch at once would take one latency): the watermark (50 % of
    # 1,776 slots) starts a drain in the background, one extent of ~250 blocks per slice
    # (over half a second each), that goes on for seconds after the writes.
    srv = server_factory(stage_spec(slow_latency="20ms", trigger="watermark", high=50, low=10,
                                    **{"destage-depth": 8}))
    ref = Reference(workdir / "ref.img")
    # Older data on the slow child: direct writes, and staged blocks destaged now.
    older = scattered(1, 200)
    ref.qemu_io(srv, [(i * 8 * MiB, 256 * 1024, 0xA0 + i) for i in range(6)] + older)
    assert destage_now(srv)["blocks"] == len(older)
    # Newer blocks, half of them over the older ones (the log holds the only current copy),
    # flushed: past the high watermark, so a destage starts.
    newer = [(offset, length, byte ^ 0xFF) for offset, length, byte in older[:100]]
    taken = {offset // BLOCK for offset, _, _ in older}
    newer += scattered(2, 900, [b for b in range(SIZE // BLOCK) if b not in taken])
    ref.qemu_io(srv, newer)
    seen = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        node = layer_node(srv, STAGE)
        activity = node.get("activity")
        if activity and 0 < activity["done_bytes"] < activity["total_bytes"]:
            seen = (activity, dict(node["detail"])["backlog"])
            break
        time.sleep(0.005)
    srv.crash()
    assert seen, "no destage was seen running"
    print("killed during", seen)

    srv.start()
    # Read while the reopened stage destages by itself (its backlog is past the watermark)…
    ref.assert_served(srv)
    # …down to the low watermark; the rest goes now. Every flushed block reads back.
    wait_backlog_at_most(srv, SLOTS * 10 // 100)
    destage_now(srv)
    assert backlog(srv) == 0, detail(srv)
    ref.assert_served(srv)
    srv.stop()
    rc, report = check(srv.disk_file("flash"))
    assert rc == 0 and not report["errors"] and report["owner"] == "stage", report


def test_staged_blocks_stay_staged_across_a_clean_restart(server_factory, workdir):
    srv = server_factory(stage_spec())  # trigger "full": nothing destages before the log fills
    ref = Reference(workdir / "ref.img")
    # 300 blocks below 40 MiB, staged; a 512 KiB write at 40 MiB, direct.
    ref.qemu_io(srv, scattered(3, 300, range(40 * MiB // BLOCK)) + [(40 * MiB, 512 * 1024, 0x5A)])
    assert counters(srv, "staged blocks", "direct writes", "destages") == [300, 1, 0], detail(srv)
    assert backlog(srv) == 300, detail(srv)
    srv.restart()
    # The log is the staged blocks' durable home: they are still there, and read back.
    assert backlog(srv) == 300, detail(srv)
    assert detail(srv)["log"].startswith(f"300 of {SLOTS} slots busy"), detail(srv)
    assert counters(srv, "staged writes", "destages") == [0, 0], detail(srv)
    ref.assert_served(srv)
    assert destage_now(srv)["blocks"] == 300
    srv.restart()
    assert backlog(srv) == 0, detail(srv)
    ref.assert_served(srv)
    srv.stop()
    rc, report = check(srv.disk_file("flash"))
    assert rc == 0 and not report["errors"] and not report["warnings"], report


def test_qemu_io_discard_and_write_zeroes_unmap_and_survive_a_restart(server_factory, workdir):
    srv = server_factory(stage_spec())
    (export,) = nbdinfo_json(srv.uri())["exports"]
    assert export["can_trim"] is True and export["can_zero"] is True, export
    ref = Reference(workdir / "ref.img")
    # A 2 MiB direct write, then 64 staged blocks inside it and 64 more elsewhere.
    ref.qemu_io(srv, [(8 * MiB, 2 * MiB, 0x11)] + scattered(5, 64, range(8 * MiB // BLOCK, 10 * MiB // BLOCK))
                + scattered(6, 64, range(20 * MiB // BLOCK, 24 * MiB // BLOCK)))
    assert backlog(srv) == 128, detail(srv)
    # Discard the first MiB of the direct write (staged blocks in it too), and zero 1 MiB of
    # the staged area with unmap allowed (qemu-io write -z -u).
    run(["qemu-io", "-f", "raw", "-t", "writeback", "-c", f"discard {8 * MiB} {MiB}",
         "-c", f"write -z -u {20 * MiB} {MiB}", "-c", "flush", srv.uri()])
    ref.data[8 * MiB:9 * MiB] = bytes(MiB)
    ref.data[20 * MiB:21 * MiB] = bytes(MiB)
    ref.path.write_bytes(ref.data)
    ref.assert_served(srv)
    (unmapped,) = counters(srv, "unmapped blocks")
    assert unmapped >= MiB // BLOCK, detail(srv)
    # Block status reports the unmapped ranges as holes, the rest of the write as data.
    extents = json.loads(run(["qemu-img", "map", "-f", "raw", "--output=json", srv.uri()]).stdout)

    def state_at(offset):
        (e,) = [e for e in extents if e["start"] <= offset < e["start"] + e["length"]]
        return e["data"], e["zero"]

    assert state_at(8 * MiB) == (False, True) and state_at(9 * MiB - BLOCK) == (False, True), extents
    assert state_at(9 * MiB) == (True, False), extents
    assert state_at(0) == (False, True), extents
    assert backlog(srv) < 128, detail(srv)
    srv.restart()
    ref.assert_served(srv)
    srv.stop()
    rc, report = check(srv.disk_file("flash"))
    assert rc == 0 and not report["errors"] and not report["warnings"], report


def test_status_answers_while_a_called_destage_runs(server_factory, workdir):
    """docs/layers/stage.md: "A destage under way shows as an activity (`destaging: N %`)" and
    `strata call LAYER destage` destages everything now. `strata status` must answer while
    such a destage runs (on a slow disk it may run for minutes) and show it."""
    # 8 writes at a time, each 20 ms (`delay` overlaps concurrent requests): seconds.
    srv = server_factory(stage_spec(slow_latency="20ms", **{"destage-depth": 8}))
    Reference(workdir / "ref.img").qemu_io(srv, scattered(4, 1000))
    call = subprocess.Popen([str(STRATA_BIN), "call", "--data-dir", str(srv.data_dir), STAGE, "destage"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        assert call.poll() is None, "the destage of 1,000 blocks at 20 ms per write ended in 0.3 s"
        started = time.monotonic()
        node = layer_node(srv, STAGE)
        took = time.monotonic() - started
        still_running = call.poll() is None
    finally:
        out, err = call.communicate(timeout=60)
    assert call.returncode == 0, err
    assert "blocks: 1000" in out, out
    assert still_running, f"`strata status` answered only after the called destage ended ({took:.1f} s)"
    assert node["activity"] and node["activity"]["what"] == "destaging", node["activity"]


def test_nbdinfo_and_qemu_img_convert_compare(server_factory, workdir):
    srv = server_factory(stage_spec())
    (e,) = nbdinfo_json(srv.uri())["exports"]
    assert e["export-size"] == SIZE
    assert (e["block_size_minimum"], e["block_size_preferred"]) == (BLOCK, MiB), e
    assert e["can_flush"] and e["can_fua"] and not e["is_read_only"], e
    src = workdir / "src.img"
    make_image(src, size=SIZE, seed=5)
    run(["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, srv.uri()])
    r = run(["qemu-img", "compare", "-f", "raw", "-F", "raw", src, srv.uri()])
    assert "Images are identical" in r.stdout
    assert counters(srv, "direct writes")[0] > 0, detail(srv)
    # Staged blocks over the converted image, then both kinds read back at once.
    ref = Reference(workdir / "ref.img")
    ref.data[:] = src.read_bytes()
    (staged,) = counters(srv, "staged writes")
    ref.qemu_io(srv, scattered(6, 64))
    assert counters(srv, "staged writes") == [staged + 64], detail(srv)
    ref.assert_served(srv)
    r = run(["qemu-img", "compare", "-f", "raw", "-F", "raw", src, srv.uri()], check=False)
    assert r.returncode == 1 and "Content mismatch" in r.stdout, r.stdout + r.stderr


# ---- an administrator breaking it -------------------------------------------------------


def served_stage_stopped(server_factory, workdir):
    """A stage with blocks on both children (destaged and still staged), stopped cleanly, the
    server's spec with a plain export beside it; returns (server, reference)."""
    srv = server_factory(stage_spec(plain=True))
    ref = Reference(workdir / "ref.img")
    ref.qemu_io(srv, [(0, 256 * 1024, 0x11)] + scattered(7, 200))
    destage_now(srv)
    ref.qemu_io(srv, scattered(8, 100))
    assert backlog(srv) == 100
    assert srv.stop() == 0
    srv.proc = None
    return srv, ref


def file_bytes(path) -> bytes:
    """A disk file past its label (labels are rewritten at every start, even a refused one)."""
    with open(path, "rb") as f:
        f.seek(LABEL)
        return f.read()


def refused(srv) -> str:
    """Starts the server: `plain` serves, `vol` is not exported, the stage shows `refused`;
    returns the reason."""
    srv.start()
    node = layer_node(srv, STAGE)
    assert node["health"] == "refused", node
    r = run(["nbdinfo", "--list", "--json", f"nbd+unix:///?socket={srv.sock}"])
    exports = [e["export-name"] for e in json.loads(r.stdout)["exports"]]
    assert exports == ["plain"], exports
    r = run(["nbdinfo", "--size", srv.uri("vol")], check=False)
    assert r.returncode != 0, f"vol is served although its stage was refused: {r.stdout}"
    reason = dict(node["detail"])["refused"]
    print("refused:", reason)
    assert srv.stop() == 0
    srv.proc = None
    return reason


def test_a_missing_fast_child_is_refused_not_created(server_factory, workdir):
    srv, ref = served_stage_stopped(server_factory, workdir)
    flash = srv.disk_file("flash")
    flash.rename(workdir / "flash.img")
    reason = refused(srv)
    assert "missing (flash)" in reason and "disks/flash.img does not exist" in reason, reason
    assert not flash.exists(), "the fast child was created anew"
    (workdir / "flash.img").rename(flash)
    srv.start()
    ref.assert_served(srv)
    assert backlog(srv) == 100


@pytest.mark.parametrize("damage", ["superblocks", "checkpoint"])
def test_damaged_metadata_is_refused_never_formatted_or_served(server_factory, workdir, damage):
    srv, ref = served_stage_stopped(server_factory, workdir)
    flash = srv.disk_file("flash")
    rc, report = check(flash)
    assert rc == 0 and report["owner"] == "stage", report
    # Garbage over both superblock copies, or over the checkpoint they point at.
    offset = report["metadata_offset"] if damage == "superblocks" else report["checkpoint_offset"]
    with open(flash, "r+b") as f:
        f.seek(offset)
        f.write(random.Random(9).randbytes(2 * BLOCK))
    damaged = file_bytes(flash)
    reason = refused(srv)
    expect = "no valid metadata superblock" if damage == "superblocks" else "is damaged"
    assert f"stage {STAGE}" in reason and expect in reason and "strata check" in reason, reason
    assert file_bytes(flash) == damaged, "the fast child was written after its metadata was damaged"
    # The refusal sends the administrator to `strata check`, which must call it damage.
    rc, report = check(flash)
    assert rc == 1 and report["errors"], f"`strata check {flash}` exited {rc}: {report['note']} {report['errors']}"


def test_swapped_children_or_a_changed_extent_are_refused(server_factory, workdir):
    srv, ref = served_stage_stopped(server_factory, workdir)
    flash, disk = srv.disk_file("flash"), srv.disk_file("disk")
    before = file_bytes(flash), file_bytes(disk)
    layer = srv.spec.layers[-1]
    layer.children = ["disk", "flash"]
    # The first child now holds no store and the second a stage's: refused as swapped,
    # whatever the labels now say, with no advice to format.
    reason = refused(srv)
    assert f"stage {STAGE}" in reason and "children look swapped" in reason, reason
    assert "--format" not in reason, reason
    assert (file_bytes(flash), file_bytes(disk)) == before, "a child was written under the swapped config"
    layer.children = ["flash", "disk"]
    layer.options = {"extent": "32MiB"}
    reason = refused(srv)
    assert "field `extent`" in reason and "fixed at creation" in reason, reason
    layer.options = {}
    srv.start()
    ref.assert_served(srv)
    assert backlog(srv) == 100
