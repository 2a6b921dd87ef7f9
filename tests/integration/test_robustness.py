"""Hostile or unlucky clients and processes: huge lengths, bad flags, stuck
clients during shutdown, SIGKILL and restart, two servers on one data dir,
and a multi-connection torture run against a model."""

from __future__ import annotations

import random
import signal
import socket
import struct
import subprocess
import threading
import time

import nbd
import pytest

import nbdraw
from harness import (MiB, STRATA_BIN, Disk, Export, ServerSpec, assert_alive_and_working, close_handle,
                     nbd_handle, pattern_bytes, requires_strata)


def vm_size_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1])
    raise RuntimeError("no VmSize")


def check_working(srv, offset=100 * MiB):
    assert_alive_and_working(srv, offset, 65536)


def raw(srv, **kw):
    c = nbdraw.RawClient(srv.sock, **kw)
    c.handshake()
    return c


def test_unknown_client_flags_disconnect(server):
    """Spec: the server MUST drop the connection if the client sets an unknown flag."""
    c = nbdraw.RawClient(server.sock)
    c.handshake(client_flags=nbdraw.FLAG_FIXED_NEWSTYLE | (1 << 20))
    # a server that ignored the flag would now answer this LIST
    try:
        c.send_option(nbdraw.OPT_LIST)
    except OSError:
        pass
    assert c.wait_closed(10), "server kept a client that sent unknown client flags"
    c.close()
    check_working(server)


def test_option_errors(server):
    c = raw(server)
    # LIST and STRUCTURED_REPLY must not carry data: NBD_REP_ERR_INVALID
    c.send_option(nbdraw.OPT_LIST, b"junk")
    opt, rtype, _ = c.read_option_reply()
    assert (opt, rtype) == (nbdraw.OPT_LIST, 0x80000003), f"{rtype:#x}"
    c.send_option(nbdraw.OPT_STRUCTURED_REPLY, b"junk")
    opt, rtype, _ = c.read_option_reply()
    assert (opt, rtype) == (nbdraw.OPT_STRUCTURED_REPLY, 0x80000003), f"{rtype:#x}"
    # GO whose name length overruns the option: NBD_REP_ERR_INVALID
    c.send_option(nbdraw.OPT_GO, struct.pack(">I", 100) + b"vol" + struct.pack(">H", 0))
    opt, rtype, _ = c.read_option_reply()
    assert (opt, rtype) == (nbdraw.OPT_GO, 0x80000003), f"{rtype:#x}"
    # unknown export: NBD_REP_ERR_UNKNOWN
    with pytest.raises(RuntimeError, match="0x80000006"):
        c.go("no-such-export")
    # INFO then GO: same size and flags, and the session continued throughout
    name = b"vol"
    c.send_option(nbdraw.OPT_INFO, struct.pack(">I", len(name)) + name + struct.pack(">HH", 1, 3))
    info = {}
    while True:
        opt, rtype, data = c.read_option_reply()
        assert opt == nbdraw.OPT_INFO
        if rtype == nbdraw.REP_ACK:
            break
        assert rtype == nbdraw.REP_INFO, f"{rtype:#x}"
        (itype,) = struct.unpack(">H", data[:2])
        if itype == 0:
            info["export"] = struct.unpack(">QH", data[2:12])
        elif itype == 3:
            info["bs"] = struct.unpack(">III", data[2:14])
    assert info["export"][0] == server.export_size()
    assert info["bs"] == (1, 4096, 32 * MiB)
    got = c.go("vol")
    assert (got["size"], got["flags"]) == info["export"]
    c.request(nbdraw.CMD_DISC, 1, 0, 0)
    c.close()


def test_abort_gets_ack(server):
    """Spec: on NBD_OPT_ABORT the server MUST reply with NBD_REP_ACK (then close)."""
    c = raw(server)
    c.send_option(nbdraw.OPT_ABORT)
    opt, rtype, _ = c.read_option_reply()
    assert (opt, rtype) == (nbdraw.OPT_ABORT, nbdraw.REP_ACK)
    assert c.wait_closed(10)
    c.close()


def test_huge_option_length_does_not_allocate(server):
    base = vm_size_kib(server.pid)
    c = raw(server)
    c.send(struct.pack(">QII", nbdraw.IHAVEOPT, 0x1234, 0xFFFFFFF0) + b"x" * 4096)
    time.sleep(1.0)
    grown = vm_size_kib(server.pid) - base
    assert grown < 2 * 1024 * 1024, f"server reserved {grown} KiB for a 4 GiB option claim"
    # either an error reply or a disconnect is fine; the server lives on
    c.close()
    check_working(server)


def test_huge_request_lengths(server):
    base = vm_size_kib(server.pid)
    c = raw(server)
    c.go("vol")
    # READ of 4 GiB - 1: refused (EINVAL/EOVERFLOW), no allocation
    c.request(nbdraw.CMD_READ, 1, 0, 0xFFFFFFFF)
    try:
        err, handle, _ = c.read_simple_reply()
        assert handle == 1 and err in (22, 75), err
    except nbdraw.Closed:
        pass  # disconnecting is allowed too
    c.close()
    c = raw(server)
    c.go("vol")
    # WRITE claiming 4 GiB - 1 of payload, of which we send 1 MiB
    c.request(nbdraw.CMD_WRITE, 2, 0, 0xFFFFFFFF, payload=b"\xcc" * MiB)
    time.sleep(1.0)
    grown = vm_size_kib(server.pid) - base
    assert grown < 2 * 1024 * 1024, f"server reserved {grown} KiB for a 4 GiB write claim"
    c.close()
    with nbd_handle(server) as h:
        assert h.pread(MiB, 0) == bytes(MiB), "a refused over-size write changed data"
    check_working(server)


def test_sigterm_with_stuck_client_exits(server):
    """A client that never reads its replies must not keep the server from
    shutting down: it may wait a while for in-flight requests (strata drains
    for up to ~10 s), but then it exits 0."""
    c = raw(server, rcvbuf=16 * 1024)
    c.go("vol")
    for i in range(4):  # 4 MiB of replies that will never be read
        c.request(nbdraw.CMD_READ, i, i * MiB, MiB)
    time.sleep(0.5)
    idle = server.connect()  # and one idle, well-behaved client
    try:
        t = time.monotonic()
        rc = server.stop(signal.SIGTERM, timeout=60)
        took = time.monotonic() - t
        assert rc == 0, f"exit {rc} after {took:.1f}s"
    finally:
        c.close()
        close_handle(idle)


def test_sigkill_then_restart(server):
    """After SIGKILL the stale sockets must not stop a restart, and flushed
    data is there."""
    data = pattern_bytes(5, 4 * MiB)
    with nbd_handle(server) as h:
        h.pwrite(data, 3 * MiB + 1)
        h.flush()
        server.proc.kill()
        server.proc.wait()
    server.stopped = True
    server.proc = None
    server.start()
    with nbd_handle(server) as h:
        assert h.pread(len(data), 3 * MiB + 1) == data
    check_working(server)


@requires_strata()
def test_second_server_on_same_data_dir_refused(server):
    """A second `strata serve` on a live data dir must fail, not take over its sockets."""
    r = subprocess.run([str(STRATA_BIN), "serve", "--config", str(server.config_path)], capture_output=True,
                       text=True, timeout=30, stdin=subprocess.DEVNULL, cwd=server.workdir)
    assert r.returncode != 0, f"second server started: {r.stdout}"
    assert "ready:" not in r.stdout
    assert server.alive()
    check_working(server)
    # the first server still owns the admin socket
    st = server.status()
    assert st["exports"][0]["name"] == "vol"


@requires_strata()
def test_status_without_server_fails(workdir):
    r = subprocess.run([str(STRATA_BIN), "status", "--data-dir", str(workdir), "--json"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode != 0
    assert r.stderr.strip(), "no error message"


@requires_strata()
def test_direct_io_disk(server_factory):
    srv = server_factory(ServerSpec(disks=[Disk("d0", 64 * MiB, direct=True)], exports=[Export("vol", "d0")]))
    with nbd_handle(srv) as h:
        minimum = h.get_block_size(nbd.SIZE_MINIMUM)
        assert minimum in (1, 512, 4096), minimum
        data = pattern_bytes(8, 8 * MiB)
        h.pwrite(data, 4 * MiB)
        h.flush()
        assert h.pread(len(data), 4 * MiB) == data
        if minimum == 1:  # unaligned I/O must then work too
            h.pwrite(b"odd", 4 * MiB + 1)
            assert h.pread(5, 4 * MiB) == data[:1] + b"odd" + data[4:5]
    with open(srv.disk_file(), "rb") as f:
        f.seek(4 * MiB + 4096)
        assert f.read(4096) == data[4096:8192]


def test_torture_many_connections_against_model(server):
    """8 connections x pipelined random write/read/trim/zero/flush on their own
    regions, checked against a model, then re-checked after a restart."""
    nconn, region = 8, 8 * MiB
    models = [bytearray(region) for _ in range(nconn)]
    errors = []

    def worker(k):
        rng = random.Random(k)
        base = k * region
        model = models[k]
        h = server.connect()
        try:
            for _ in range(400):
                batch = []
                used = []
                for _ in range(rng.randrange(1, 12)):
                    # non-overlapping ops within a batch so completion order doesn't matter
                    for _ in range(20):
                        off = rng.randrange(0, region - 1)
                        ln = min(rng.choice([1, 17, 512, 4096, 65536, rng.randrange(1, 300000)]), region - off)
                        if all(off + ln <= a or b <= off for a, b in used):
                            break
                    else:
                        continue
                    used.append((off, off + ln))
                    op = rng.random()
                    if op < 0.45:
                        data = rng.randbytes(ln)
                        model[off:off + ln] = data
                        batch.append(("w", h.aio_pwrite(data, base + off), None))
                    elif op < 0.8:
                        buf = nbd.Buffer(ln)
                        batch.append(("r", h.aio_pread(buf, base + off), (buf, bytes(model[off:off + ln]))))
                    elif op < 0.9:
                        model[off:off + ln] = bytes(ln)
                        batch.append(("z", h.aio_zero(ln, base + off), None))
                    else:
                        # trim leaves contents unspecified: follow with a zero so the model stays exact
                        h.trim(ln, base + off)
                        model[off:off + ln] = bytes(ln)
                        h.zero(ln, base + off)
                while h.aio_in_flight() > 0:
                    h.poll(-1)
                for kind, cookie, extra in batch:
                    assert h.aio_command_completed(cookie)
                    if kind == "r":
                        buf, want = extra
                        assert bytes(buf.to_bytearray()) == want, f"conn {k}: read mismatch"
                if rng.random() < 0.1:
                    h.flush()
            h.flush()
        except Exception as e:  # noqa: BLE001
            errors.append((k, repr(e)))
        finally:
            close_handle(h)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(nconn)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors

    def verify():
        with nbd_handle(server) as h:
            for k in range(nconn):
                for off in range(0, region, 4 * MiB):
                    assert h.pread(4 * MiB, k * region + off) == bytes(models[k][off:off + 4 * MiB]), \
                        f"conn {k} region mismatch at {off}"

    verify()
    server.restart()
    verify()
