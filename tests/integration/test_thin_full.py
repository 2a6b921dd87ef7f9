"""A thin pool running out of space, through real clients: two over-committed volumes fill a
small pool until writes fail with ENOSPC (`when-full = "fail"`), every acknowledged byte
reads back in both volumes, a trim from nbdsh frees space and writes resume; with
`when-full = "wait"` a write blocks until a trim from another connection frees an extent, and
fails with ENOSPC after `full-wait` when nothing is freed. `strata status --json` and the
Prometheus endpoint show the usage and the low-space flag."""

from __future__ import annotations

import os
import threading
import time
import urllib.request

import nbd
import pytest

from harness import MiB, STRATA_BIN, Disk, Export, Layer, ServerSpec, Volume, nbd_handle, pattern_bytes, requires_strata, run

pytestmark = requires_strata()

EXTENT = 64 * 1024
VOLUME = 4 * MiB  # two of them: 8 MiB of volumes over a 3 MiB disk (about 2 MiB of data space)


def full_spec(**options) -> ServerSpec:
    return ServerSpec(
        disks=[Disk("d0", 3 * MiB)],
        layers=[Layer(extent=EXTENT, volumes=[Volume("a", VOLUME), Volume("b", VOLUME)], options=options)],
        exports=[Export("a", "pool/a"), Export("b", "pool/b")],
        metrics=True,
    )


def pool_node(srv) -> dict:
    return next(d for d in srv.status()["devices"] if d["kind"] == "thin-pool")


def detail(node: dict) -> dict:
    return dict(node["detail"])


def volume_detail(pool: dict, name: str) -> dict:
    return detail(next(c for c in pool["children"] if c["kind"] == "thin" and c["name"] == name))


def metric(srv, name: str, **labels) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        body = r.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in body.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(None, 1)[1])
    raise AssertionError(f"no sample {name}{{{want}}} in\n{body}")


def pool_extents(srv) -> int:
    """Data extents of the pool (the disk minus its label and the metadata region)."""
    allocated, total = detail(pool_node(srv))["extents allocated"].split(" of ")
    assert allocated == "0"
    return int(total)


def trim_with_nbdsh(srv, export: str, offset: int, length: int) -> None:
    # nbdsh runs the first python3 on PATH; the libnbd bindings belong to the system one.
    env = {**os.environ, "PATH": f"/usr/bin:{os.environ.get('PATH', '')}"}
    run(["nbdsh", "-u", srv.uri(export), "-c", f"h.trim({length}, {offset})"], env=env)


class Filler:
    """Writes whole extents alternately into a and b, remembering what was acknowledged."""

    def __init__(self, a, b):
        self.handles = {"a": a, "b": b}
        self.acknowledged: dict[tuple[str, int], bytes] = {}
        self.next = {"a": 0, "b": 0}
        self.turn = 0

    def write_next(self) -> None:
        name = "ab"[self.turn % 2]
        offset = self.next[name]
        data = pattern_bytes(self.turn + 1, EXTENT)
        self.handles[name].pwrite(data, offset)  # raises on ENOSPC: nothing is recorded
        self.acknowledged[(name, offset)] = data
        self.next[name] += EXTENT
        self.turn += 1

    def verify(self) -> None:
        for (name, offset), data in self.acknowledged.items():
            assert self.handles[name].pread(len(data), offset) == data, f"{name} lost its data at {offset}"


def fill_until_enospc(filler: Filler, srv, extents: int) -> None:
    low_at = -(-extents * 80 // 100)  # the default low-water mark: 80 %, rounded up
    for i in range(extents):
        if i == low_at - 1:
            assert detail(pool_node(srv))["low space"] == "false"
            assert metric(srv, "strata_thin_low_space", pool="pool") == 0
        filler.write_next()
        if i == low_at - 1:
            assert detail(pool_node(srv))["low space"] == "true", "crossing the low-water mark"
    with pytest.raises(nbd.Error) as ei:
        filler.write_next()
    assert ei.value.errno == "ENOSPC"


def test_full_pool_fails_with_enospc_keeps_data_and_resumes_after_trim(server_factory):
    srv = server_factory(full_spec())
    extents = pool_extents(srv)
    assert 24 <= extents <= 32, extents
    with nbd_handle(srv, export="a") as a, nbd_handle(srv, export="b") as b:
        filler = Filler(a, b)
        fill_until_enospc(filler, srv, extents)
        assert len(filler.acknowledged) == extents
        # The other volume is refused too; writes into mapped extents still work.
        with pytest.raises(nbd.Error) as ei:
            b.pwrite(b"\x01" * 4096, VOLUME - 4096)
        assert ei.value.errno == "ENOSPC"
        patch = pattern_bytes(99, 8192)
        a.pwrite(patch, 4096, nbd.CMD_FLAG_FUA)
        first = bytearray(filler.acknowledged[("a", 0)])
        first[4096:4096 + 8192] = patch
        filler.acknowledged[("a", 0)] = bytes(first)
        a.flush()
        b.flush()
        filler.verify()

        pool = pool_node(srv)
        d = detail(pool)
        assert d["extents allocated"] == f"{extents} of {extents}"
        assert d["data used"] == "100.0 %"
        assert d["low space"] == "true" and pool["health"] == "degraded"
        assert int(d["granules live"]) == extents * EXTENT // 4096
        assert d["extents partly dead"] == "0"
        assert int(d["allocations refused"]) >= 2
        for name in "ab":
            v = volume_detail(pool, name)
            mapped = filler.next[name] // EXTENT
            assert v["extents mapped"] == str(mapped)
            assert int(v["granules live"]) == mapped * EXTENT // 4096
        text = srv.status("--data-dir", str(srv.data_dir), json_out=False)
        assert "LOW SPACE" in text, text
        assert metric(srv, "strata_thin_low_space", pool="pool") == 1
        assert metric(srv, "strata_thin_low_space_events_total", pool="pool") == 1
        assert metric(srv, "strata_thin_no_space_errors_total", pool="pool") >= 2
        assert metric(srv, "strata_thin_volume_extents_allocated", pool="pool", volume="b") == filler.next["b"] // EXTENT

        # A trim from another client frees b's last extent; the refused write now goes in.
        last_b = filler.next["b"] - EXTENT
        trim_with_nbdsh(srv, "b", last_b, EXTENT)
        del filler.acknowledged[("b", last_b)]
        assert b.pread(EXTENT, last_b) == bytes(EXTENT)
        assert detail(pool_node(srv))["extents allocated"] == f"{extents - 1} of {extents}"
        tail = pattern_bytes(7, 4096)
        b.pwrite(tail, VOLUME - 4096)
        b.flush()
        filler.acknowledged[("b", VOLUME - 4096)] = tail
        filler.verify()
        assert metric(srv, "strata_thin_extents_freed_total", pool="pool") == 1
    srv.restart()
    with nbd_handle(srv, export="a") as a, nbd_handle(srv, export="b") as b:
        filler.handles = {"a": a, "b": b}
        filler.verify()


def test_wait_policy_holds_a_write_until_a_trim_and_fails_after_the_bound(server_factory):
    srv = server_factory(full_spec(**{"when-full": "wait", "full-wait": "3s"}))
    assert detail(pool_node(srv))["when full"] == "wait up to 3s"
    extents = pool_extents(srv)
    with nbd_handle(srv, export="a") as a, nbd_handle(srv, export="b") as b:
        filler = Filler(a, b)
        for _ in range(extents):
            filler.write_next()
        assert detail(pool_node(srv))["extents allocated"] == f"{extents} of {extents}"

        # A write needing a new extent blocks...
        waiting = pattern_bytes(55, 4096)
        outcome: dict = {}

        def blocked_write():
            with nbd_handle(srv, export="a") as h:
                try:
                    h.pwrite(waiting, VOLUME - 4096)
                    outcome["ok"] = time.monotonic()
                except nbd.Error as e:
                    outcome["error"] = e

        thread = threading.Thread(target=blocked_write)
        thread.start()
        time.sleep(1.0)
        assert not outcome, f"the write did not wait for space: {outcome}"
        assert detail(pool_node(srv))["writes waiting for space"] == "1"
        # ...until a trim from another connection frees an extent.
        freed_at = time.monotonic()
        trim_with_nbdsh(srv, "b", 0, EXTENT)
        del filler.acknowledged[("b", 0)]
        thread.join(timeout=10)
        assert "ok" in outcome, outcome
        assert outcome["ok"] - freed_at < 2.0
        assert a.pread(4096, VOLUME - 4096) == waiting
        filler.verify()

        # With nothing freed, a write fails with ENOSPC after the bound, not before.
        started = time.monotonic()
        with pytest.raises(nbd.Error) as ei:
            b.pwrite(b"\x02" * 4096, VOLUME - 4096)
        waited = time.monotonic() - started
        assert ei.value.errno == "ENOSPC"
        assert 2.9 <= waited < 8, waited
        # Writes into mapped extents never wait.
        started = time.monotonic()
        a.pwrite(b"\x03" * 4096, 0)
        assert time.monotonic() - started < 1.0
        assert detail(pool_node(srv))["writes waiting for space"] == "0"


def test_full_pool_grows_when_its_concat_gets_a_member(server_factory, workdir):
    """Virtual Allocation's storage expansion: `strata add-member` grows the concat under a
    full pool, the pool takes the new extents in, refused writes go through, and the grown
    pool comes back after a restart with every byte."""
    spec = ServerSpec(
        disks=[Disk("d0", 3 * MiB)],
        layers=[
            Layer(name="c", kind="concat", children=["d0"]),
            Layer(extent=EXTENT, children=["c"], volumes=[Volume("a", VOLUME), Volume("b", VOLUME)]),
        ],
        exports=[Export("a", "pool/a"), Export("b", "pool/b")],
        metrics=True,
    )
    srv = server_factory(spec)
    extents = pool_extents(srv)
    with nbd_handle(srv, export="a") as a, nbd_handle(srv, export="b") as b:
        filler = Filler(a, b)
        fill_until_enospc(filler, srv, extents)
    run([STRATA_BIN, "add-member", "--data-dir", srv.data_dir, "c", workdir / "d1.img"])
    srv.keep_config = True
    with nbd_handle(srv, export="a") as a, nbd_handle(srv, export="b") as b:
        filler.handles = {"a": a, "b": b}
        grown = 0
        while True:
            try:
                filler.write_next()
            except nbd.Error as e:
                assert e.errno == "ENOSPC"
                break
            grown += 1
        assert grown >= 32, f"only {grown} more extents after adding a 3 MiB disk"
        d = detail(pool_node(srv))
        assert d["extents allocated"] == f"{extents + grown} of {extents + grown}"
        filler.verify()
    srv.restart()
    assert detail(pool_node(srv))["extents allocated"] == f"{extents + grown} of {extents + grown}"
    with nbd_handle(srv, export="a") as a, nbd_handle(srv, export="b") as b:
        filler.handles = {"a": a, "b": b}
        filler.verify()
