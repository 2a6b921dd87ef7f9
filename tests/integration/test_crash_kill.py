"""Real-process crash test: `kill -9` of `strata serve` under a writing, flushing client.

A thin pool (64 KiB extents, 50 ms timer commits, an over-committed 1 GiB volume on a
256 MiB disk) is served by a real `strata serve`.  A libnbd client keeps up to 8 requests in
flight: writes of 1-16 self-describing 4 KiB blocks (some FUA), WRITE_ZEROES (some NO_HOLE,
some FUA, some whole extents, so extents are freed and reused), trims, flushes and reads
checked against the model.  The server is SIGKILLed at a random moment (after a random number
of requests with some still in flight, from a timer thread 0-300 ms in, or right after an
acknowledged flush), `strata check` must find its metadata undamaged, now and then the
restart itself is killed during recovery, and the restarted server (which must recover by
itself) must return, for every block, a value the model allows:

* the value of the last write acknowledged before a FLUSH was *sent*, when that FLUSH was
  acknowledged (or of an acknowledged FUA write), or any value written after it;
* zeros after WRITE_ZEROES; after a trim, zeros or the value it had before.

Every block written carries magic, volume, block number, write generation and a hash-derived
body, so a failure names exactly what was read: zeros, a stale generation, another volume's
block, or garbage.  The model then collapses to what was read and the next iteration kills
the recovered server again (recovery of recovery).  The second test runs two volumes in one
pool and checks that neither ever shows the other's data.  At the end a clean SIGTERM must
exit 0, `strata check` must say clean/consistent and every acknowledged write must be there.

Environment:
    STRATA_KILL_SEED=<n>          replay a seed (printed at the start and in every failure)
    STRATA_KILL_ITERATIONS=<k>    kills per test (default 60, ~0.5 s each); 1000 for a soak
    STRATA_KILL_TIMER=0           no timer-thread kills: the request sequence and the moment
                                  of every kill are then reproducible from the seed (the
                                  server's own progress still is not)

    STRATA_KILL_ITERATIONS=500 /usr/bin/python3 -m pytest tests/integration/test_crash_kill.py
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import signal
import struct
import threading
import time

import nbd
import pytest

from harness import (MiB, GiB, STRATA_BIN, Disk, Export, Layer, ServerSpec, Volume, close_handle,
                     requires_strata, run)

pytestmark = requires_strata()

BLOCK = 4096
EXTENT = 64 * 1024
EXTENT_BLOCKS = EXTENT // BLOCK
ZERO_BLOCK = bytes(BLOCK)
MAGIC = b"STRATAK9"
HEADER = struct.Struct("<8s16sQQQ")  # magic, volume, block, generation, seed
HOT_BLOCKS = 4 * MiB // BLOCK  # a small zone that sees most overwrites, frees and reuse

ITERATIONS = int(os.environ.get("STRATA_KILL_ITERATIONS", "60"))
TIMER_KILLS = os.environ.get("STRATA_KILL_TIMER", "1") != "0"
_SEED_ENV = os.environ.get("STRATA_KILL_SEED")
SEED = int(_SEED_ENV) if _SEED_ENV else int.from_bytes(os.urandom(4), "little")
# an iteration takes ~0.5 s on 2 cores; the timeout only catches hangs
TIMEOUT = 120 + 3 * ITERATIONS
STALL = 60.0  # seconds without any reply while the server runs: it hangs


def replay_line(test: str) -> str:
    return (f"STRATA_KILL_SEED={SEED} STRATA_KILL_ITERATIONS={ITERATIONS}"
            f"{'' if TIMER_KILLS else ' STRATA_KILL_TIMER=0'} "
            f"/usr/bin/python3 -m pytest tests/integration/test_crash_kill.py -k {test}")


# ---------------------------------------------------------------------------
# self-describing blocks


def make_block(vol: str, blk: int, gen: int) -> bytes:
    head = HEADER.pack(MAGIC, vol.encode(), blk, gen, SEED)
    digest = hashlib.blake2b(head, digest_size=64).digest()
    body_len = BLOCK - len(head)
    return head + (digest * (body_len // 64 + 1))[:body_len]


def decode_block(data: bytes):
    """(vol, blk, gen) for an intact block, 0 for zeros, or a string describing garbage."""
    if data == ZERO_BLOCK:
        return 0
    if data[:8] == MAGIC:
        _, vol, blk, gen, seed = HEADER.unpack_from(data)
        vol = vol.rstrip(b"\0").decode(errors="replace")
        if make_block(vol, blk, gen) == data and seed == SEED:
            return (vol, blk, gen)
        return (f"garbled block whose header claims volume {vol!r} block {blk} generation {gen} "
                f"(seed {seed}); body differs from that block's")
    nonzero = sum(1 for b in data if b)
    return f"garbage ({nonzero} non-zero bytes; first 32: {data[:32].hex()})"


# ---------------------------------------------------------------------------
# the model


class Op:
    __slots__ = ("kind", "vol", "start", "n", "gen", "fua", "nohole", "idx", "state", "iteration", "no",
                 "cover", "buf", "flushed_by")

    def __init__(self, kind, vol, start=0, n=0, gen=0, fua=False, nohole=False, iteration=0, no=0):
        self.kind, self.vol, self.start, self.n, self.gen = kind, vol, start, n, gen
        self.fua, self.nohole, self.iteration, self.no = fua, nohole, iteration, no
        self.idx = {}  # block -> index of its entry in the block's history
        self.state = "in flight"
        self.cover = 0  # flush: completed ops (log position) it makes durable
        self.buf = None
        self.flushed_by = None

    def blocks(self):
        return range(self.start, self.start + self.n)

    def __str__(self):
        what = self.kind + (" FUA" if self.fua else "") + (" NO_HOLE" if self.nohole else "")
        rng = f" blocks {self.start}..{self.start + self.n - 1}" if self.n else ""
        fl = f", covered by flush #{self.flushed_by}" if self.flushed_by is not None else ""
        return f"iteration {self.iteration} request #{self.no} {what}{rng} ({self.state}{fl})"


class VolModel:
    """Per 4 KiB block, the history of values since the last durable point.

    hist[b] is a list of (gen, op): gen 0 means zeros, op None is the baseline, op.kind
    "trim" an entry that may read as zeros or as what was there before.  floor[b] indexes
    the oldest entry the block may still hold after a crash: it rises when an acknowledged
    FLUSH covers an acknowledged write, or when a FUA write is acknowledged.  Requests on a
    volume never overlap while in flight, so a block's entries are in completion order.
    """

    def __init__(self, name: str, nblocks: int):
        self.name = name
        self.nblocks = nblocks
        self.hist: dict[int, list] = {}
        self.floor: dict[int, int] = {}
        self.busy: set[int] = set()
        self.log: list[Op] = []  # acknowledged writes/zeros/trims in the order seen
        self.applied = 0  # log prefix already made durable by flushes

    def record(self, op: Op) -> None:
        gen = op.gen if op.kind == "write" else 0
        for b in op.blocks():
            h = self.hist.setdefault(b, [(0, None)])
            op.idx[b] = len(h)
            h.append((gen, op))
            self.floor.setdefault(b, 0)

    @staticmethod
    def _is_weak(entry) -> bool:
        return entry[1] is not None and entry[1].kind == "trim"

    def make_durable(self, op: Op) -> None:
        for b, i in op.idx.items():
            h = self.hist[b]
            while self._is_weak(h[i]):  # a trim may have left the previous value
                i -= 1
            if i > self.floor[b]:
                self.floor[b] = i

    def flush_done(self, flush: Op) -> None:
        if flush.cover > self.applied:
            for op in self.log[self.applied:flush.cover]:
                if op.flushed_by is None:
                    op.flushed_by = flush.no
                self.make_durable(op)
            self.applied = flush.cover

    def allowed(self, b: int) -> list:
        """Entries the block may hold after a crash (weak ones as zeros)."""
        h = self.hist.get(b)
        if h is None:
            return [(0, None)]
        return h[self.floor[b]:]

    def live_allowed(self, b: int) -> set:
        """Values a read may return while the server runs and nothing is in flight on b."""
        h = self.hist.get(b, [(0, None)])
        i = len(h) - 1
        out = set()
        while self._is_weak(h[i]):
            out.add(0)
            i -= 1
        out.add(h[i][0])
        return out

    def collapse(self, b: int, gen: int) -> None:
        self.hist[b] = [(gen, None)]
        self.floor[b] = 0


def describe_entry(vol: str, blk: int, entry) -> str:
    gen, op = entry
    if op is None:
        return "zeros (never written)" if gen == 0 else f"gen {gen} (read back after an earlier crash)"
    if op.kind == "write":
        return f"gen {gen} from {op}"
    if op.kind == "trim":
        return f"zeros or the previous value, from {op}"
    return f"zeros from {op}"


# ---------------------------------------------------------------------------
# the client


class Conn:
    """One libnbd handle on one volume, with its requests in flight."""

    def __init__(self, srv, model: VolModel):
        self.model = model
        self.h = srv.connect(export=model.name)
        self.inflight: dict[int, Op] = {}
        self.dead = False


class Run:
    def __init__(self, srv, models: list[VolModel], rng: random.Random, test: str):
        self.srv = srv
        self.models = models
        self.rng = rng
        self.test = test
        self.gen = 0
        self.killed = threading.Event()
        self.failures: list[str] = []
        self.conns: list[Conn] = []
        self.iteration = 0
        self.opno = 0
        self.last_progress = time.monotonic()
        self.stats = dict(kills=0, in_flight_at_kill=0, acked_flushes=0, requests=0, unknown=0,
                          torn_journal=0, startup_kills=0, timer_kills=0, op_kills=0, quiet_kills=0)

    def fail(self, msg: str) -> None:
        pytest.fail(f"{msg}\nseed {SEED}; replay with:\n  {replay_line(self.test)}", pytrace=False)

    # ---- completions ------------------------------------------------------
    def complete(self, c: Conn, op: Op, err) -> None:
        m = c.model
        self.last_progress = time.monotonic()
        for b in op.blocks():
            m.busy.discard(b)
        if err is not None:
            op.state = f"failed: {err}"
            if not self.killed.is_set():
                self.fail(f"volume {m.name}: {op} failed while the server was running: {err}")
            self.stats["unknown"] += 1
            return
        op.state = "acknowledged"
        if op.kind == "flush":
            self.stats["acked_flushes"] += 1
            m.flush_done(op)
        elif op.kind == "read":
            data = bytes(op.buf.to_bytearray())
            for i, b in enumerate(op.blocks()):
                got = decode_block(data[i * BLOCK:(i + 1) * BLOCK])
                ok = m.live_allowed(b)
                if not self.matches(m, b, got, ok):
                    self.fail(f"volume {m.name} block {b}: a read while the server ran returned "
                              f"{self.what(got)}; expected {self.gens_text(m.name, b, ok)}")
        else:
            m.log.append(op)
            if op.fua:
                m.make_durable(op)

    def reap(self, c: Conn) -> None:
        for cookie, op in list(c.inflight.items()):
            try:
                done = c.h.aio_command_completed(cookie)
                err = None
            except nbd.Error as e:
                done, err = True, e
            if done:
                del c.inflight[cookie]
                self.complete(c, op, err)

    def pump(self, timeout: float = 1.0) -> None:
        rl, wl, by_fd = [], [], {}
        for c in self.conns:
            if c.dead or not c.inflight:
                continue
            try:
                d = c.h.aio_get_direction()
                fd = c.h.aio_get_fd()
            except nbd.Error:
                self.conn_died(c)
                continue
            if d & nbd.AIO_DIRECTION_READ:
                rl.append(fd)
            if d & nbd.AIO_DIRECTION_WRITE:
                wl.append(fd)
            by_fd[fd] = c
        if by_fd:
            r, w, _ = select.select(rl, wl, [], timeout)
            for fds, notify in ((r, "aio_notify_read"), (w, "aio_notify_write")):
                for fd in fds:
                    c = by_fd[fd]
                    if c.dead:
                        continue
                    try:
                        getattr(c.h, notify)()
                    except nbd.Error as e:
                        self.conn_died(c, e)
        else:
            time.sleep(min(timeout, 0.005))
        busy = [c for c in self.conns if c.inflight and not c.dead]
        if busy and not self.killed.is_set() and time.monotonic() - self.last_progress > STALL:
            self.fail(f"iteration {self.iteration}: no reply for {STALL:.0f} s while the server runs; in flight: "
                      + "; ".join(str(op) for c in busy for op in c.inflight.values()))
        for c in self.conns:
            self.reap(c)
            if not c.dead and c.inflight and c.h.aio_is_dead():
                self.conn_died(c)

    def conn_died(self, c: Conn, err=None) -> None:
        if not self.killed.is_set():
            self.fail(f"connection to volume {c.model.name} died while the server was running: {err}")
        self.reap(c)
        c.dead = True

    # ---- issuing ----------------------------------------------------------
    def pick_range(self, m: VolModel, kind: str):
        rng = self.rng
        for _ in range(6):
            if kind in ("zero", "trim") and rng.random() < 0.5:
                n = EXTENT_BLOCKS * rng.choice((1, 1, 2))
                zone = HOT_BLOCKS if rng.random() < 0.7 else m.nblocks
                start = rng.randrange(0, zone - n + 1, EXTENT_BLOCKS)
            else:
                n = rng.randint(1, 16) if rng.random() < 0.8 else rng.randint(1, 4)
                zone = HOT_BLOCKS if rng.random() < 0.5 else m.nblocks
                start = rng.randrange(0, zone - n + 1)
            if not any(b in m.busy for b in range(start, start + n)):
                return start, n
        return None

    def issue(self, c: Conn, max_inflight: int) -> bool:
        """Issue one random request on c; False if the connection is gone."""
        rng = self.rng
        m = c.model
        while len(c.inflight) >= max_inflight and not c.dead:
            self.pump()
        if c.dead or (self.killed.is_set() and c.h.aio_is_dead()):
            return False
        r = rng.random()
        kind = ("write" if r < 0.62 else "zero" if r < 0.70 else "trim" if r < 0.76
                else "flush" if r < 0.88 else "read")
        if kind == "flush":
            op = Op("flush", m.name, iteration=self.iteration, no=self.opno)
            op.cover = len(m.log)
        else:
            picked = None
            while picked is None:
                picked = self.pick_range(m, kind)
                if picked is None:
                    if not c.inflight:
                        raise AssertionError("no free range although nothing is in flight")
                    self.pump()
                    if c.dead:
                        return False
            start, n = picked
            op = Op(kind, m.name, start, n, iteration=self.iteration, no=self.opno)
            if kind == "write":
                self.gen += 1
                op.gen = self.gen
                op.fua = rng.random() < 0.15
            elif kind == "zero":
                op.fua = rng.random() < 0.15
                op.nohole = rng.random() < 0.3
            for b in op.blocks():
                m.busy.add(b)
            if kind != "read":
                m.record(op)  # before sending: if sending fails, its effect is unknown
        self.opno += 1
        self.stats["requests"] += 1
        try:
            off = op.start * BLOCK
            if kind == "write":
                data = b"".join(make_block(m.name, b, op.gen) for b in op.blocks())
                cookie = c.h.aio_pwrite(data, off, flags=nbd.CMD_FLAG_FUA if op.fua else 0)
            elif kind == "zero":
                flags = (nbd.CMD_FLAG_FUA if op.fua else 0) | (nbd.CMD_FLAG_NO_HOLE if op.nohole else 0)
                cookie = c.h.aio_zero(op.n * BLOCK, off, flags=flags)
            elif kind == "trim":
                cookie = c.h.aio_trim(op.n * BLOCK, off)
            elif kind == "flush":
                cookie = c.h.aio_flush()
            else:
                op.buf = nbd.Buffer(op.n * BLOCK)
                cookie = c.h.aio_pread(op.buf, off)
        except nbd.Error as e:
            for b in op.blocks():
                m.busy.discard(b)
            op.state = f"not sent: {e}"
            self.conn_died(c, e)
            return False
        if not c.inflight:
            self.last_progress = time.monotonic()
        c.inflight[cookie] = op
        return True

    def drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(c.inflight and not c.dead for c in self.conns) and time.monotonic() < deadline:
            self.pump(0.2)

    # ---- verification -----------------------------------------------------
    @staticmethod
    def matches(m: VolModel, b: int, got, gens) -> bool:
        if got == 0:
            return 0 in gens
        return isinstance(got, tuple) and got[0] == m.name and got[1] == b and got[2] in gens

    @staticmethod
    def what(got) -> str:
        if got == 0:
            return "zeros"
        if isinstance(got, tuple):
            return f"volume {got[0]!r} block {got[1]} gen {got[2]}"
        return got

    def gens_text(self, vol: str, b: int, gens) -> str:
        return " or ".join("zeros" if g == 0 else f"volume {vol!r} block {b} gen {g}" for g in sorted(gens))

    def verify(self, when: str) -> None:
        """Read every block of every volume's test region and check it against the model;
        then make what was read the durable state."""
        problems = []
        bad = 0
        reads = {}
        for m in self.models:
            h = self.srv.connect(export=m.name)
            try:
                chunk = 8 * MiB
                data = bytearray()
                for off in range(0, m.nblocks * BLOCK, chunk):
                    data += h.pread(min(chunk, m.nblocks * BLOCK - off), off)
            finally:
                close_handle(h)
            reads[m.name] = data
            for b in range(m.nblocks):
                got = decode_block(bytes(data[b * BLOCK:(b + 1) * BLOCK]))
                entries = m.allowed(b)
                gens = {e[0] for e in entries}
                if not self.matches(m, b, got, gens):
                    bad += 1
                    if len(problems) >= 8:
                        continue
                    h_all = m.hist.get(b, [(0, None)])
                    lines = [f"volume {m.name!r} block {b} (byte offset {b * BLOCK:#x}): read {self.what(got)}"]
                    if isinstance(got, tuple) and got[0] != m.name:
                        lines[0] += "  <-- ANOTHER VOLUME'S DATA"
                    elif isinstance(got, tuple) and got[1] != b:
                        lines[0] += "  <-- ANOTHER BLOCK'S DATA"
                    lines.append("    allowed after the crash:")
                    lines += [f"      {describe_entry(m.name, b, e)}" for e in entries]
                    older = h_all[:m.floor.get(b, 0)]
                    if older:
                        lines.append("    older values, no longer allowed (a later one was made durable):")
                        lines += [f"      {describe_entry(m.name, b, e)}" for e in older]
                    problems.append("\n".join(lines))
        if problems:
            self.fail(f"{when}: {bad} blocks hold data the model does not allow"
                      f"{f' (the first {len(problems)} shown)' if bad > len(problems) else ''}:\n"
                      + "\n".join(problems))
        for m in self.models:
            data = reads[m.name]
            for b in list(m.hist):
                got = decode_block(bytes(data[b * BLOCK:(b + 1) * BLOCK]))
                m.collapse(b, 0 if got == 0 else got[2])
            m.log.clear()
            m.applied = 0
            m.busy.clear()

    # ---- one iteration: write until killed ---------------------------------
    def connect_all(self) -> None:
        self.conns = [Conn(self.srv, m) for m in self.models]

    def close_all(self) -> None:
        for c in self.conns:
            close_handle(c.h)
        self.conns = []

    def kill_now(self) -> None:
        self.killed.set()
        os.kill(self.srv.pid, signal.SIGKILL)

    def iterate(self) -> None:
        rng = self.rng
        self.killed.clear()
        self.connect_all()
        max_inflight = rng.choice((1, 2, 4, 8, 8))
        modes = ["ops", "ops", "ops", "quiet"] + (["timer", "timer"] if TIMER_KILLS else [])
        mode = rng.choice(modes)
        budget = rng.randint(5, 400) if mode != "timer" else 20000
        timer = None
        if mode == "timer":
            delay = rng.uniform(0.0, 0.3)
            timer = threading.Timer(delay, self.kill_now)
            timer.start()
        try:
            for _ in range(budget):
                if self.killed.is_set():
                    break
                c = rng.choice(self.conns)
                if not self.issue(c, max_inflight):
                    break
            if mode == "ops":
                # kill with requests in flight, right away or after the server got to some
                pause = rng.choice((0.0, 0.0, rng.uniform(0, 0.005), rng.uniform(0, 0.06)))
                if pause:
                    time.sleep(pause)
                self.stats["in_flight_at_kill"] += sum(len(c.inflight) for c in self.conns)
                self.stats["op_kills"] += 1
                self.kill_now()
            elif mode == "quiet":
                # everything acknowledged, then one flush per volume acknowledged, then
                # maybe a pause for timer commits: all of it must survive
                self.drain(30)
                for c in self.conns:
                    op = Op("flush", c.model.name, iteration=self.iteration, no=self.opno)
                    self.opno += 1
                    op.cover = len(c.model.log)
                    c.inflight[c.h.aio_flush()] = op
                self.drain(30)
                assert not any(c.inflight for c in self.conns), "requests still in flight after 30 s"
                time.sleep(rng.choice((0.0, rng.uniform(0, 0.12))))
                self.stats["quiet_kills"] += 1
                self.kill_now()
            else:
                while not self.killed.is_set():
                    self.pump(0.05)
                self.stats["in_flight_at_kill"] += sum(len(c.inflight) for c in self.conns)
                self.stats["timer_kills"] += 1
        finally:
            if timer is not None:
                timer.cancel()
                timer.join()
        rc = self.srv.crash()
        if rc != -signal.SIGKILL:
            self.fail(f"iteration {self.iteration}: the server exited {rc} before it was killed\n"
                      f"{self.srv.stderr_text()[-5000:]}")
        self.stats["kills"] += 1
        # replies the server sent before it died still count as acknowledgements
        self.drain(5)
        for c in self.conns:
            for op in c.inflight.values():
                op.state = "in flight at the kill"
                self.stats["unknown"] += 1
                for b in op.blocks():
                    c.model.busy.discard(b)
            c.inflight.clear()
        self.close_all()

    # ---- offline check and restart ----------------------------------------
    def check_offline(self, when: str) -> dict:
        disk = self.srv.disk_file("d0")
        r = run([STRATA_BIN, "check", "--json", disk], check=False, timeout=60)
        if r.returncode != 0:
            self.fail(f"{when}: strata check exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        report = json.loads(r.stdout.splitlines()[0])
        if report["errors"]:
            self.fail(f"{when}: strata check found damage: {report}")
        if report["owner"] != "thin-pool":
            self.fail(f"{when}: strata check: owner {report['owner']!r}")
        if any("torn" in w for w in report["warnings"]):
            self.stats["torn_journal"] += 1
        return report

    def restart(self) -> None:
        rng = self.rng
        if rng.random() < 0.15:
            # kill the restart itself, somewhere in recovery or soon after it
            self.srv.spawn()
            time.sleep(rng.uniform(0.0, 0.05))
            rc = self.srv.crash()
            if rc != -signal.SIGKILL:
                self.fail(f"iteration {self.iteration}: the restart exited {rc} by itself\n"
                          f"{self.srv.stderr_text()[-5000:]}")
            self.stats["startup_kills"] += 1
            self.check_offline(f"iteration {self.iteration}, after killing the restart")
        self.srv.start()  # waits for ready:
        log = self.srv.stderr_text()
        if "metadata recovered" not in log:
            self.fail(f"iteration {self.iteration}: no 'metadata recovered' in the restart's log:\n{log[-3000:]}")
        if "thin pool formatted" in log:
            self.fail(f"iteration {self.iteration}: the restart formatted the pool again:\n{log[-3000:]}")

    def loop(self, iterations: int) -> None:
        for it in range(iterations):
            self.iteration = it
            self.iterate()
            self.check_offline(f"iteration {it}, after kill -9")
            self.restart()
            self.verify(f"iteration {it}, after kill -9 and restart")

    def clean_finish(self) -> None:
        """Writes without a flush, SIGTERM: exit 0, check says clean, and all of it is there."""
        self.iteration = "final"
        self.killed.clear()
        self.connect_all()
        for _ in range(60):
            self.issue(self.rng.choice(self.conns), 4)
        self.drain(30)
        assert not any(c.inflight for c in self.conns)
        self.close_all()
        rc = self.srv.stop(signal.SIGTERM)
        if rc != 0:
            self.fail(f"exit {rc} on SIGTERM\n{self.srv.stderr_text()[-5000:]}")
        r = run([STRATA_BIN, "check", self.srv.disk_file("d0")], check=False, timeout=60)
        verdict = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        if r.returncode != 0 or not ("clean" in verdict or "consistent" in verdict):
            self.fail(f"strata check after a clean shutdown exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        for m in self.models:  # a clean shutdown flushes everything acknowledged
            for op in m.log:
                m.make_durable(op)
        self.srv.proc = None
        self.srv.start()
        self.verify("after SIGTERM and restart")

    def summary(self, t0: float) -> str:
        s = self.stats
        return (f"seed {SEED}: {s['kills']} kills ({s['op_kills']} after N requests, {s['timer_kills']} by timer, "
                f"{s['quiet_kills']} after an acknowledged flush, {s['startup_kills']} more during restarts), "
                f"{s['requests']} requests, {s['acked_flushes']} flushes acknowledged, {s['in_flight_at_kill']} "
                f"requests in flight at kills, {s['unknown']} with unknown outcome, {s['torn_journal']} torn "
                f"journal tails seen by strata check; {time.monotonic() - t0:.1f} s")


# ---------------------------------------------------------------------------


def pool_spec(volumes: list[str]) -> ServerSpec:
    return ServerSpec(
        disks=[Disk("d0", 256 * MiB)],
        layers=[Layer("pool", "thin-pool", ["d0"], extent=EXTENT, commit_interval_ms=50,
                      volumes=[Volume(v, 1 * GiB) for v in volumes])],  # over-committed on purpose
        exports=[Export(v, f"pool/{v}") for v in volumes],
    )


def crash_loop(server_factory, request, volumes: list[str], region: int, salt: int) -> None:
    test = request.node.name
    print(f"\n{test}: seed {SEED}, {ITERATIONS} iterations; replay: {replay_line(test)}")
    rng = random.Random(SEED * 1_000_003 + salt)
    srv = server_factory(pool_spec(volumes))
    if "thin pool formatted" not in srv.stderr_text():
        pytest.fail(f"first start did not format the pool:\n{srv.stderr_text()}")
    r = Run(srv, [VolModel(v, region // BLOCK) for v in volumes], rng, test)
    t0 = time.monotonic()
    r.loop(ITERATIONS)
    r.clean_finish()
    print(r.summary(t0))


@pytest.mark.timeout(TIMEOUT)
def test_kill9_thin_volume(server_factory, request):
    crash_loop(server_factory, request, ["vol"], 96 * MiB, 1)


@pytest.mark.timeout(TIMEOUT)
def test_kill9_two_volumes_one_pool(server_factory, request):
    crash_loop(server_factory, request, ["a", "b"], 64 * MiB, 2)
