"""Versions policies through the CLI and real clients: periodic snapshots by write count with
keep-K (manual snapshots untouched), shown by `strata snapshot policy` and `strata status`,
kept across a restart; protected snapshots; a pool's snapshot reserve refusing a snapshot
(`refuse`) and deleting the oldest unprotected one when writes bring free space under it
(`delete-oldest`), each with its log line and its count in status."""

from __future__ import annotations

import json
import math
import time

from harness import (admin_command, admin_refused, MiB, Disk, Export, Layer, ServerSpec, Volume, nbd_handle,
                     pattern_bytes, requires_strata)

pytestmark = requires_strata()

EXTENT = 64 * 1024


def snapshot(srv, *args: str):
    return admin_command(srv, "snapshot", *args)


def listed(srv, of: str = "pool/v") -> dict[str, dict]:
    rows = json.loads(snapshot(srv, "list", of, "--json").stdout)
    return {row["name"]: row for row in rows}


def policy(srv, *flags: str) -> dict:
    return json.loads(snapshot(srv, "policy", "pool/v", *flags, "--json").stdout)


def node(status: dict, name: str) -> dict:
    def walk(nodes):
        for n in nodes:
            if n["name"] == name:
                return n
            found = walk(n.get("children", []))
            if found:
                return found
        return None
    found = walk(status["devices"])
    assert found, f"no device {name} in {status['devices']}"
    return found


def detail(n: dict, key: str) -> str:
    for k, v in n["detail"]:
        if k == key:
            return v
    raise AssertionError(f"no {key!r} in {n['detail']}")


def wait_for(what: str, check, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_periodic_snapshots_by_writes_keep_k_status_and_restart(server_factory):
    srv = server_factory(ServerSpec(
        disks=[Disk("d0", 256 * MiB)],
        layers=[Layer(extent=EXTENT, volumes=[Volume("v", 64 * MiB)])],
        exports=[Export("v", "pool/v")],
    ))
    out = snapshot(srv, "policy", "pool/v").stdout
    assert out.strip() == "pool/v: no periodic snapshots", out
    # Bad values are refused with the field named; nothing is set.
    assert "field `every`" in admin_refused(srv, "snapshot", "policy", "pool/v", "--every", "10x")
    assert "field `keep`" in admin_refused(srv, "snapshot", "policy", "pool/v", "--every", "1m", "--keep", "0")
    assert "field `every-writes`" in admin_refused(srv, "snapshot", "policy", "pool/v", "--every-writes", "lots")
    assert "give it alone" in admin_refused(srv, "snapshot", "policy", "pool/v", "--off", "--every", "1m")
    assert policy(srv).get("policy") is None, "TOML answers leave an unset field out"

    out = snapshot(srv, "policy", "pool/v", "--every-writes", "4", "--keep", "2").stdout
    assert out.startswith("pool/v: every 4 writes, keep 2"), out
    snapshot(srv, "create", "pool/v", "manual")
    contents = {}
    for round_ in range(4):
        data = pattern_bytes(round_ + 10, MiB)
        with nbd_handle(srv, export="v") as h:
            for i in range(4):  # four write requests: the fourth makes a snapshot due
                h.pwrite(data[i * (MiB // 4):(i + 1) * (MiB // 4)], i * (MiB // 4))
            h.flush()
        before = set(contents)
        new = wait_for(f"automatic snapshot {round_}",
                       lambda: [n for n in listed(srv) if n.startswith("auto-") and n not in before])
        assert len(new) == 1, new
        contents[new[0]] = data
    rows = listed(srv)
    autos = sorted((n for n in rows if n.startswith("auto-")), key=lambda n: rows[n]["epoch"])
    # Keep 2: the two newest automatic ones; the manual one is never the policy's to delete.
    newest = sorted(contents, key=lambda n: list(contents).index(n))[-2:]
    assert autos == newest, (autos, list(contents))
    assert "manual" in rows
    for name in autos:
        snapshot(srv, "export", "pool/v", name)
        with nbd_handle(srv, export=f"pool/v@{name}") as h:
            assert h.pread(MiB, 0) == contents[name], name

    shown = policy(srv)
    assert shown["policy"] == "every 4 writes, keep 2"
    assert shown["last_auto"] == autos[-1]
    assert shown["policy_snapshots"] == autos
    text = snapshot(srv, "policy", "pool/v").stdout
    assert f"last automatic snapshot: {autos[-1]}" in text and "after 4 more writes" in text, text
    status = srv.status()
    v = node(status, "v")
    assert detail(v, "snapshot policy") == "every 4 writes, keep 2"
    assert detail(v, "last automatic snapshot").startswith(autos[-1]), v["detail"]
    assert detail(v, "next automatic snapshot") == "after 4 more writes"
    pool = node(status, "pool")
    assert detail(pool, "automatic snapshots taken") == "4"
    assert detail(pool, "automatic snapshots deleted (keep)") == "2"
    assert metric(srv, "strata_thin_snapshots_automatic_total") == 4
    assert metric(srv, "strata_thin_snapshots_automatic_deleted_total") == 2
    human = srv.status(json_out=False)
    assert "snapshot policy = every 4 writes, keep 2" in human, human
    assert "automatic snapshot deleted: the policy keeps only its last K" in srv.stderr_text()

    # Protection: a protected snapshot cannot be deleted until it is unprotected.
    out = snapshot(srv, "protect", "pool/v", "manual").stdout
    assert "pool/v@manual is protected" in out, out
    assert "is protected" in admin_refused(srv, "snapshot", "delete", "pool/v", "manual")
    assert policy(srv)["protected"] == ["manual"]

    # The policy and the protection are on disk; the write count starts again at zero.
    srv.restart()
    shown = policy(srv)
    assert shown["policy"] == "every 4 writes, keep 2"
    assert shown["policy_snapshots"] == autos and shown["protected"] == ["manual"]
    assert shown["writes_since"] == 0
    assert "is protected" in admin_refused(srv, "snapshot", "delete", "pool/v", "manual")
    snapshot(srv, "unprotect", "pool/v", "manual")
    snapshot(srv, "delete", "pool/v", "manual")
    out = snapshot(srv, "policy", "pool/v", "--off").stdout
    assert out.strip().startswith("pool/v: no periodic snapshots"), out
    assert sorted(listed(srv)) == sorted(autos), "off keeps what the policy took"


def reserve_spec(when_low: str) -> ServerSpec:
    # 15 MiB of data space (240 extents of 64 KiB); a reserve of 50 %: 120 extents.
    return ServerSpec(
        disks=[Disk("d0", 16 * MiB)],
        layers=[Layer(extent=EXTENT, metadata_size=1 * MiB, volumes=[Volume("v", 32 * MiB)],
                      options={"snapshot-reserve": "50%", "when-reserve-low": when_low})],
        exports=[Export("v", "pool/v")],
    )


def size(n: int) -> str:
    """Bytes as Strata prints them: the largest unit that divides them exactly."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def metric(srv, name: str) -> float:
    """One sample of the pool's metrics (`strata metrics`)."""
    for line in admin_command(srv, "metrics").stdout.splitlines():
        if line.startswith(f'{name}{{pool="pool"}} '):
            return float(line.rsplit(None, 1)[1])
    raise AssertionError(f"no {name} for the pool")


def write(srv, offset: int, length: int, seed: int) -> bytes:
    data = pattern_bytes(seed, length)
    with nbd_handle(srv, export="v") as h:
        h.pwrite(data, offset)
        h.flush()
    return data


def test_a_snapshot_reserve_refuses_snapshots_below_it(server_factory):
    srv = server_factory(reserve_spec("refuse"))
    write(srv, 0, 6 * MiB, 1)
    snapshot(srv, "create", "pool/v", "s1")  # 9 MiB free: above the 7.5 MiB reserve
    write(srv, 8 * MiB, 3 * MiB, 2)          # 6 MiB free
    said = admin_refused(srv, "snapshot", "create", "pool/v", "s2")
    pool = node(srv.status(), "pool")
    allocated, extents = (int(n) for n in detail(pool, "extents allocated").split(" of "))
    free, reserve = extents - allocated, math.ceil(extents / 2)
    assert free < reserve
    assert f"snapshot of pool/v refused: free space {size(free * EXTENT)} ({free} extents) is below the " \
           f"snapshot reserve {size(reserve * EXTENT)} ({reserve} extents; snapshot-reserve = \"50%\", " \
           "when-reserve-low = \"refuse\")" in said, said
    assert list(listed(srv)) == ["s1"], "nothing deleted"
    assert detail(pool, "snapshots refused for the reserve") == "1"
    assert detail(pool, "snapshot reserve") == \
        f"50% ({size(reserve * EXTENT)} in {reserve} extents; free {size(free * EXTENT)}, BELOW)"
    assert "refused a snapshot of v" in detail(pool, "last versions action")
    assert metric(srv, "strata_thin_snapshot_reserve_refusals_total") == 1
    log = srv.stderr_text()
    assert "snapshot refused: the pool's free space is below its snapshot reserve" in log, log[-3000:]


def test_delete_oldest_deletes_the_oldest_unprotected_snapshot_when_writes_go_below(server_factory):
    srv = server_factory(reserve_spec("delete-oldest"))
    write(srv, 0, 2 * MiB, 1)
    snapshot(srv, "create", "pool/v", "old")
    snapshot(srv, "export", "pool/v", "old")
    second = write(srv, 0, 2 * MiB, 2)       # "old" alone holds the first 2 MiB now
    snapshot(srv, "create", "pool/v", "kept")
    snapshot(srv, "protect", "pool/v", "kept")
    third = write(srv, 16 * MiB, 4 * MiB, 3)  # 8 MiB allocated, 7 MiB free: below 7.5 MiB
    wait_for("the oldest snapshot deleted", lambda: "old" not in listed(srv))
    assert list(listed(srv)) == ["kept"]
    # Its export went with the pool's next verb (the list above).
    assert "pool/v@old" not in [e["name"] for e in srv.status()["exports"]]
    pool = node(srv.status(), "pool")
    assert detail(pool, "snapshots deleted for the reserve") == "1"
    assert "deleted v@old for the reserve" in detail(pool, "last versions action")
    assert metric(srv, "strata_thin_snapshot_reserve_deletes_total") == 1
    assert not detail(pool, "snapshot reserve").endswith("BELOW)"), detail(pool, "snapshot reserve")
    log = srv.stderr_text()
    line = next((l for l in log.splitlines() if "snapshot deleted: the pool's free space is below" in l), None)
    assert line and "snapshot=old" in line and "reserve_bytes=" in line and "free_bytes=" in line, log[-3000:]
    # What is left reads as it should.
    snapshot(srv, "export", "pool/v", "kept")
    with nbd_handle(srv, export="pool/v@kept") as h:
        assert h.pread(2 * MiB, 0) == second
    with nbd_handle(srv, export="v") as h:
        assert h.pread(4 * MiB, 16 * MiB) == third
