"""NBD protocol behaviour through libnbd (python `nbd`) and a raw socket client."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import nbd
import pytest

import nbdraw
from harness import (MiB, Disk, Export, ServerSpec, assert_alive_and_working, close_handle, nbd_handle,
                     pattern_bytes)


def expect_nbd_error(fn, *errnos):
    with pytest.raises(nbd.Error) as ei:
        fn()
    if errnos:
        assert ei.value.errno in errnos, f"expected {errnos}, got {ei.value.errno}: {ei.value.string}"
    return ei.value


# ---------------------------------------------------------------------------
# ordinary I/O


def test_unaligned_io_matches_model(server):
    """Random unaligned writes/reads at odd offsets and lengths against a local model."""
    rng = random.Random(1234)
    span = 4 * MiB + 333
    model = bytearray(span)
    with nbd_handle(server) as h:
        for i in range(400):
            off = rng.randrange(0, span - 1)
            ln = rng.choice([1, 2, 3, 511, 513, 4095, 4097, rng.randrange(1, 70000)])
            ln = min(ln, span - off)
            if rng.random() < 0.6:
                data = rng.randbytes(ln)
                h.pwrite(data, off)
                model[off:off + ln] = data
            else:
                got = h.pread(ln, off)
                assert got == bytes(model[off:off + ln]), f"op {i}: mismatch reading {ln} at {off}"
        h.flush()
    # read through a second connection in odd-sized pieces
    with nbd_handle(server) as h2:
        pos = 0
        while pos < span:
            ln = min(rng.randrange(1, 300000), span - pos)
            assert h2.pread(ln, pos) == bytes(model[pos:pos + ln]), f"mismatch at {pos}+{ln}"
            pos += ln


def test_aio_many_in_flight(server):
    """Many concurrent (pipelined) unaligned requests on one connection."""
    rng = random.Random(99)
    chunks = [(i * 65537 + 3, rng.randbytes(65537 - 7)) for i in range(64)]
    with nbd_handle(server) as h:
        cookies = [h.aio_pwrite(data, off) for off, data in chunks]
        while h.aio_in_flight() > 0:
            h.poll(-1)
        for c in cookies:
            assert h.aio_command_completed(c)
        reads = []
        for off, data in chunks:
            buf = nbd.Buffer(len(data))
            reads.append((buf, data, h.aio_pread(buf, off)))
        while h.aio_in_flight() > 0:
            h.poll(-1)
        for buf, data, c in reads:
            assert h.aio_command_completed(c)
            assert bytes(buf.to_bytearray()) == data


def test_fua_write_and_flush(server):
    with nbd_handle(server) as h:
        assert h.can_fua()
        assert h.can_flush()
        data = pattern_bytes(7, 3 * 4096 + 5)
        h.pwrite(data, 12345, nbd.CMD_FLAG_FUA)
        h.flush()
        assert h.pread(len(data), 12345) == data
    with open(server.disk_file(), "rb") as f:  # FUA/flush: the data is in the backing file
        f.seek(12345)
        assert f.read(len(data)) == data


def test_fua_flag_accepted_on_every_command(server):
    """NBD spec, command flags: with NBD_FLAG_SEND_FUA negotiated "the server
    MUST accept all commands with this bit set (even by ignoring the bit)";
    existing clients are known to set it on reads."""
    data = pattern_bytes(17, 4096)
    with nbd_handle(server) as w:
        w.pwrite(data, 0)
        w.flush()
    with nbd_handle(server, strict=False, meta=True) as h:
        assert h.can_fua()
        fua = nbd.CMD_FLAG_FUA
        assert h.pread(4096, 0, fua) == data
        h.flush(fua)
        h.cache(4096, 0, fua)
        got = []
        h.block_status(4096, 0, lambda ctx, off, ents, err: got.append(ents) or 0, fua)
        assert got
        h.trim(4096, MiB, fua)
        h.zero(4096, MiB, fua)
        h.pwrite(data, 2 * MiB, fua)
        assert h.pread(4096, 2 * MiB) == data


def test_unknown_command_flag_einval(server):
    with nbd_handle(server, strict=False) as h:
        with pytest.raises(nbd.Error) as ei:
            h.pwrite(b"x" * 512, 0, 1 << 9)
        assert ei.value.errno == "EINVAL"
        assert h.pread(512, 0) == bytes(512), "a refused write changed data"


def test_multi_conn_consistency(server):
    """can_multi_conn: a flush on one connection makes writes visible on another."""
    with nbd_handle(server) as a, nbd_handle(server) as b:
        assert a.can_multi_conn()
        for i in range(20):
            data = pattern_bytes(i, 4096 + i)
            a.pwrite(data, i * 10000)
            a.flush()
            assert b.pread(len(data), i * 10000) == data


def test_cache_command(server):
    with nbd_handle(server) as h:
        assert h.can_cache()
        h.cache(MiB, 0)
        h.cache(5, 3)


def test_zero_length_requests(server):
    """Zero-length READ/WRITE/TRIM/WRITE_ZEROES are no-ops that succeed."""
    data = pattern_bytes(5, 4096)
    with nbd_handle(server) as w:
        w.pwrite(data, 0)
        w.flush()
    with nbd_handle(server, strict=False) as h:
        assert h.pread(0, 100) == b""
        h.pwrite(b"", 100)
        h.trim(0, 100)
        h.zero(0, 100)
        h.flush()
        assert h.pread(4096, 0) == data
    assert_alive_and_working(server)


# NBD spec, "Error values": a write (or write-zeroes) past the end SHOULD fail
# with ENOSPC, a read, trim or block-status past the end with EINVAL.
PAST_END_ERRNO = {"read": "EINVAL", "trim": "EINVAL", "block_status": "EINVAL",
                  "write": "ENOSPC", "zero": "ENOSPC"}


@pytest.mark.parametrize("op", ["read", "write", "trim", "zero", "block_status"])
def test_past_the_end_is_refused(server, op):
    size = server.export_size()
    sentinel = pattern_bytes(11, 4096)
    with nbd_handle(server) as w:
        w.pwrite(sentinel, size - 4096)
        w.pwrite(sentinel, 0)
        w.flush()
    with nbd_handle(server, strict=False, meta=True) as h:
        assert h.get_size() == size
        cases = [(size - 2048, 4096), (size, 1), (size + MiB, 4096), (2**64 - 512, 1024)]
        for off, ln in cases:
            want = [PAST_END_ERRNO[op]]
            if off + ln > 2**64:  # offset + length overflows: EINVAL is as right as ENOSPC
                want.append("EINVAL")
            if op == "read":
                expect_nbd_error(lambda: h.pread(ln, off), *want)
            elif op == "write":
                expect_nbd_error(lambda: h.pwrite(b"\xee" * ln, off), *want)
            elif op == "trim":
                expect_nbd_error(lambda: h.trim(ln, off), *want)
            elif op == "zero":
                expect_nbd_error(lambda: h.zero(ln, off), *want)
            else:
                expect_nbd_error(lambda: h.block_status(ln, off, lambda *a: 0), *want)
        # the connection is still usable after the errors
        assert h.pread(4096, size - 4096) == sentinel
        # and nothing wrapped around to offset 0 or touched the tail
        assert h.pread(4096, 0) == sentinel


@pytest.mark.parametrize("op", ["read", "write"])
def test_oversize_request_refused(server, op):
    """A 64 MiB request (> the 32 MiB advertised maximum) is refused with an
    error or a disconnect; the server survives and the data is untouched."""
    base = 8 * MiB
    before = pattern_bytes(21, 64 * MiB)
    with nbd_handle(server) as w:
        assert w.get_block_size(nbd.SIZE_MAXIMUM) <= 32 * MiB
        for i in range(0, len(before), 16 * MiB):
            w.pwrite(before[i:i + 16 * MiB], base + i)
        w.flush()
    h = server.connect(strict=False)
    try:
        with pytest.raises(nbd.Error):
            if op == "read":
                h.pread(64 * MiB, base)
            else:
                h.pwrite(b"\x5a" * (64 * MiB), base)
    finally:
        close_handle(h)
    assert server.alive()
    assert server.rss_kib() < 512 * 1024
    with nbd_handle(server) as r:
        for i in range(0, len(before), 16 * MiB):
            assert r.pread(16 * MiB, base + i) == before[i:i + 16 * MiB], f"data changed at {base + i}"
    assert_alive_and_working(server)


def test_block_status_after_trim(server):
    with nbd_handle(server, meta=True) as h:
        assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
        assert h.can_trim()
        h.pwrite(pattern_bytes(3, 4 * MiB), 4 * MiB)
        h.flush()
        h.trim(MiB, 5 * MiB)
        h.flush()
        extents = block_status(h, 4 * MiB, 4 * MiB)
        # [4, 5) MiB: data (not a hole)
        for off, ln, flags in clip(extents, 4 * MiB, 5 * MiB):
            assert not flags & nbd.STATE_HOLE, f"written data reported as hole: {extents}"
        # [5, 6) MiB: trimmed → reads as zero
        trimmed = clip(extents, 5 * MiB, 6 * MiB)
        assert trimmed, extents
        for off, ln, flags in trimmed:
            assert flags & nbd.STATE_ZERO, f"trimmed range not reported zero: {extents}"
        assert h.pread(MiB, 5 * MiB) == bytes(MiB)
        # [6, 8) MiB: still data
        assert h.pread(2 * MiB, 6 * MiB) == pattern_bytes(3, 4 * MiB)[2 * MiB:]
        # a never-written region far away is a hole
        far = block_status(h, MiB, 100 * MiB)
        for off, ln, flags in clip(far, 100 * MiB, 101 * MiB):
            assert flags & nbd.STATE_ZERO, far


def test_structured_read_chunks_and_df(server):
    """Structured READ replies cover the request exactly (data and hole
    chunks); with NBD_CMD_FLAG_DF the reply is a single data chunk."""
    d1, d2 = pattern_bytes(61, 65536), pattern_bytes(62, 65536)
    expect = d1 + bytes(MiB - 65536) + d2 + bytes(MiB - 65536)
    with nbd_handle(server) as h:
        h.pwrite(d1, 0)
        h.pwrite(d2, MiB)
        h.flush()
        chunks = []

        def cb(sub, off, status, err):
            chunks.append((off, len(sub), status))
            if status == nbd.READ_HOLE:
                assert bytes(sub).count(0) == len(sub)
            return 0

        assert h.pread_structured(2 * MiB, 0, cb) == expect
        covered = sorted((o, o + n) for o, n, st in chunks if st in (nbd.READ_DATA, nbd.READ_HOLE))
        pos = 0
        for a, b in covered:
            assert a == pos, f"gap or overlap in chunks: {chunks}"
            pos = b
        assert pos == 2 * MiB
        assert h.can_df()
        chunks.clear()
        assert h.pread_structured(2 * MiB, 0, cb, nbd.CMD_FLAG_DF) == expect
        assert chunks == [(0, 2 * MiB, nbd.READ_DATA)], chunks


def test_meta_context_negotiation(server):
    # LIST_META_CONTEXT with no queries: the server lists what it supports
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.connect_uri(server.uri())
    got = []
    n = h.opt_list_meta_context(lambda name: got.append(name) or 0)
    assert n == len(got)
    assert "base:allocation" in got, got
    # a query for an unknown namespace matches nothing
    h.add_meta_context("nosuch:context")
    got2 = []
    h.opt_list_meta_context(lambda name: got2.append(name) or 0)
    assert got2 == [], got2
    h.opt_abort()
    close_handle(h)
    # SET_META_CONTEXT: base:allocation accepted, the unknown one not
    h = nbd.NBD()
    h.add_meta_context("nosuch:context")
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(server.uri())
    assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    assert not h.can_meta_context("nosuch:context")
    seen = []
    h.block_status(MiB, 0, lambda ctx, off, ents, err: seen.append(ctx) or 0)
    assert seen == [nbd.CONTEXT_BASE_ALLOCATION]
    close_handle(h)


def block_status(h, length, offset):
    """Return [(offset, length, flags)] for base:allocation, following
    short replies until `length` is covered."""
    out = []
    pos = offset
    end = offset + length
    while pos < end:
        got = []

        def cb(metacontext, off, entries, err):
            if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
                got.append((off, list(entries)))
            return 0

        h.block_status(end - pos, pos, cb)
        assert len(got) == 1, got
        off, entries = got[0]
        assert off == pos
        assert entries and len(entries) % 2 == 0
        for i in range(0, len(entries), 2):
            ln, fl = entries[i], entries[i + 1]
            assert ln > 0, entries
            out.append((pos, ln, fl))
            pos += ln
    return out


def clip(extents, lo, hi):
    res = []
    for off, ln, fl in extents:
        a, b = max(off, lo), min(off + ln, hi)
        if a < b:
            res.append((a, b - a, fl))
    return res


def test_write_zeroes(server):
    with nbd_handle(server) as h:
        assert h.can_zero()
        for i, flags in enumerate([0, nbd.CMD_FLAG_NO_HOLE]):
            off = 16 * MiB + i * 2 * MiB
            h.pwrite(pattern_bytes(i, 2 * MiB), off)
            h.zero(MiB + 4097, off + 511, flags)
            got = h.pread(2 * MiB, off)
            exp = bytearray(pattern_bytes(i, 2 * MiB))
            exp[511:511 + MiB + 4097] = bytes(MiB + 4097)
            assert got == exp, f"zero flags={flags}"
        off = 24 * MiB
        h.pwrite(pattern_bytes(9, MiB), off)
        if h.can_fast_zero():
            try:
                h.zero(MiB, off, nbd.CMD_FLAG_FAST_ZERO)
            except nbd.Error as e:
                assert e.errno == "ENOTSUP", e
                assert h.pread(MiB, off) == pattern_bytes(9, MiB), "failed fast zero changed data"
            else:
                assert h.pread(MiB, off) == bytes(MiB)


def test_read_only_export_refuses_writes(server_factory):
    spec = ServerSpec(disks=[Disk("d0", 16 * MiB)], exports=[Export("ro", "d0", read_only=True)])
    srv = server_factory(spec)
    with nbd_handle(srv, strict=False) as h:
        assert h.is_read_only()
        before = h.pread(MiB, 0)
        expect_nbd_error(lambda: h.pwrite(b"x" * 4096, 0), "EPERM")
        expect_nbd_error(lambda: h.pwrite(b"x" * 4096, 0, nbd.CMD_FLAG_FUA), "EPERM")
        expect_nbd_error(lambda: h.trim(4096, 0), "EPERM")
        expect_nbd_error(lambda: h.zero(4096, 0), "EPERM")
        assert h.pread(MiB, 0) == before
    with open(srv.disk_file(), "rb") as f:
        assert f.read(MiB) == bytes(MiB)


def test_sixty_four_clients(server):
    n = 64
    barrier = threading.Barrier(n)

    def worker(i):
        h = server.connect()
        try:
            barrier.wait(timeout=60)
            off = i * 2 * MiB + i  # unaligned, non-overlapping
            data = pattern_bytes(1000 + i, 256 * 1024 + i)
            h.pwrite(data, off)
            h.flush()
            assert h.pread(len(data), off) == data
            return True
        finally:
            close_handle(h)

    with ThreadPoolExecutor(n) as ex:
        results = list(ex.map(worker, range(n)))
    assert results == [True] * n
    with nbd_handle(server) as h:
        for i in range(n):
            data = pattern_bytes(1000 + i, 256 * 1024 + i)
            assert h.pread(len(data), i * 2 * MiB + i) == data


# ---------------------------------------------------------------------------
# raw protocol


def raw_connect(srv, export="vol", **kw):
    c = nbdraw.RawClient(srv.sock, **kw)
    c.handshake()
    return c


def test_raw_unknown_command_einval(server):
    c = raw_connect(server)
    info = c.go("vol")
    assert info["size"] == server.export_size()
    c.request(0x77, 0xDEAD, 0, 0)
    err, handle, _ = c.read_simple_reply()
    assert handle == 0xDEAD
    assert err == nbdraw.EINVAL, f"unknown command answered with error {err}"
    # the session goes on
    c.request(nbdraw.CMD_READ, 0xBEEF, 0, 512)
    err, handle, data = c.read_simple_reply(512)
    assert (err, handle, len(data)) == (0, 0xBEEF, 512)
    c.request(nbdraw.CMD_DISC, 1, 0, 0)
    assert c.wait_closed(10), "server did not close after NBD_CMD_DISC"
    c.close()
    assert_alive_and_working(server)


def test_raw_unknown_option_unsup(server):
    c = raw_connect(server)
    c.send_option(0x1234, b"\x01\x02\x03\x04")
    opt, rtype, _ = c.read_option_reply()
    assert opt == 0x1234
    assert rtype == nbdraw.REP_ERR_UNSUP, f"reply {rtype:#x}"
    # session continues: LIST works
    assert "vol" in c.list_exports()
    c.send_option(nbdraw.OPT_ABORT)
    try:
        opt, rtype, _ = c.read_option_reply()
        assert (opt, rtype) == (nbdraw.OPT_ABORT, nbdraw.REP_ACK)
    except nbdraw.Closed:
        pass  # the spec lets the server close without the ACK
    assert c.wait_closed(10), "server did not close after NBD_OPT_ABORT"
    c.close()
    assert_alive_and_working(server)


def test_raw_export_name_option(server):
    """The old NBD_OPT_EXPORT_NAME path still works."""
    data = pattern_bytes(77, 4096)
    with nbd_handle(server) as h:
        h.pwrite(data, 4096)
        h.flush()
    c = raw_connect(server)
    size, flags = c.export_name("vol")
    assert size == server.export_size()
    c.request(nbdraw.CMD_READ, 5, 4096, 4096)
    err, handle, got = c.read_simple_reply(4096)
    assert (err, handle, got) == (0, 5, data)
    c.request(nbdraw.CMD_DISC, 6, 0, 0)
    assert c.wait_closed(10)
    c.close()


def test_raw_go_unknown_export(server):
    c = raw_connect(server)
    with pytest.raises(RuntimeError, match="GO failed"):
        c.go("no-such-export")
    # after an error reply the client may try again
    c.go("vol")
    c.request(nbdraw.CMD_DISC, 1, 0, 0)
    c.close()


@pytest.mark.parametrize("where", ["handshake", "transmission"])
def test_raw_garbage_disconnects_only_that_client(server, where):
    good = server.connect()
    try:
        data = pattern_bytes(31, 65536)
        good.pwrite(data, 0)
        good.flush()
        c = nbdraw.RawClient(server.sock)
        c.handshake()
        if where == "transmission":
            c.go("vol")
        c.send(b"\x13\x37garbage!" * 16)  # bad magic
        assert c.wait_closed(10), "server kept a client that sent garbage"
        c.close()
        # the other client is unaffected
        assert good.pread(len(data), 0) == data
        good.pwrite(data[::-1], 65536)
        assert good.pread(65536, 65536) == data[::-1]
    finally:
        close_handle(good)
    assert_alive_and_working(server)


def test_raw_abrupt_disconnect_mid_write(server):
    keep = pattern_bytes(41, 4 * MiB)
    with nbd_handle(server) as h:
        h.pwrite(keep, 32 * MiB)
        h.flush()
    c = raw_connect(server)
    c.go("vol")
    # claims 1 MiB of payload for [33 MiB, 34 MiB) but sends only 100 KiB
    c.request(nbdraw.CMD_WRITE, 1, 33 * MiB, MiB, payload=b"\xaa" * (100 * 1024))
    time.sleep(0.2)
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    time.sleep(0.3)
    assert server.alive()
    with nbd_handle(server) as h:
        got = h.pread(4 * MiB, 32 * MiB)
    # outside the interrupted write: intact
    assert got[:MiB] == keep[:MiB]
    assert got[2 * MiB:] == keep[2 * MiB:]
    # bytes the server never received were not written either
    assert got[MiB + 100 * 1024:2 * MiB] == keep[MiB + 100 * 1024:2 * MiB]
    assert_alive_and_working(server)


def test_raw_client_never_reads_replies(server):
    """Flooding READs without reading replies must not make the server buffer
    unbounded amounts of reply data; other clients keep working."""
    c = raw_connect(server, rcvbuf=64 * 1024)
    c.go("vol")
    c.sock.setblocking(False)
    req = b"".join(nbdraw.RawClient.request_bytes(nbdraw.CMD_READ, i, (i % 200) * MiB, MiB) for i in range(65536))
    sent = 0
    stalled_since = None
    deadline = time.monotonic() + 20
    peak = 0
    while sent < len(req) and time.monotonic() < deadline:
        try:
            sent += c.sock.send(req[sent:sent + 65536])
            stalled_since = None
        except BlockingIOError:
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > 3:
                break  # the server stopped reading requests: back-pressure
            time.sleep(0.05)
        except OSError:
            break  # server dropped us: also acceptable
        peak = max(peak, server.rss_kib())
    for _ in range(30):
        peak = max(peak, server.rss_kib())
        time.sleep(0.1)
    try:
        # while the flooder is still connected, a well-behaved client works
        assert_alive_and_working(server)
        peak = max(peak, server.rss_kib())
    finally:
        c.close()
    assert peak < 512 * 1024, f"server RSS reached {peak} KiB while a client did not read replies"
    time.sleep(0.5)
    assert_alive_and_working(server)


def test_raw_structured_reply_negotiation(server):
    c = raw_connect(server)
    c.send_option(nbdraw.OPT_STRUCTURED_REPLY)
    opt, rtype, _ = c.read_option_reply()
    assert (opt, rtype) == (nbdraw.OPT_STRUCTURED_REPLY, nbdraw.REP_ACK)
    info = c.go("vol")
    assert info["block_size"][1] == 4096
    data = pattern_bytes(8, 4096)
    with nbd_handle(server) as h:
        h.pwrite(data, 8192)
        h.flush()
    c.request(nbdraw.CMD_READ, 9, 8192, 4096)
    buf = bytearray(4096)
    covered = 0
    while True:
        magic, flags, rtype, handle, length = struct.unpack(">IHHQI", c.recvall(20))
        assert magic == nbdraw.STRUCTURED_REPLY_MAGIC, hex(magic)
        assert handle == 9
        payload = c.recvall(length)
        if rtype == 1:  # NBD_REPLY_TYPE_OFFSET_DATA
            (off,) = struct.unpack(">Q", payload[:8])
            buf[off - 8192:off - 8192 + length - 8] = payload[8:]
            covered += length - 8
        elif rtype == 2:  # NBD_REPLY_TYPE_OFFSET_HOLE
            off, hl = struct.unpack(">QI", payload)
            covered += hl
        else:
            assert rtype == 0, f"unexpected chunk type {rtype}"
        if flags & 1:  # NBD_REPLY_FLAG_DONE
            break
    assert covered == 4096
    assert bytes(buf) == data
    c.request(nbdraw.CMD_DISC, 1, 0, 0)
    c.close()
