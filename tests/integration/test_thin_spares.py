"""A thin pool that grows from spare disks when it crosses its low-water mark (Virtual
Allocation's storage expansion): the pool sits on a concat, `grow-from` lists spare files;
each crossing appends the next spare to the concat (labelled, config rewritten), the pool
takes in the new extents, and every byte written before and after reads back, across a
restart. A spare that is not there is logged and refused; the server keeps serving."""

from __future__ import annotations

import time

from harness import MiB, Disk, Export, Layer, ServerSpec, Volume, nbd_handle, pattern_bytes, requires_strata

pytestmark = requires_strata()

EXTENT = 64 * 1024
SPARE = 4 * MiB


def spec(spares: list[str]) -> ServerSpec:
    return ServerSpec(
        disks=[Disk("d0", 4 * MiB)],
        layers=[
            Layer(name="data", kind="concat", children=["d0"]),
            Layer(children=["data"], extent=EXTENT, volumes=[Volume("v", 32 * MiB)],
                  options={"low-water": "50%", "grow-from": spares}),
        ],
        exports=[Export("v", "pool/v")],
        metrics=True,
    )


def pool_detail(srv) -> dict:
    node = next(d for d in srv.status()["devices"] if d["kind"] == "thin-pool")
    return dict(node["detail"])


def extents(srv) -> tuple[int, int]:
    allocated, total = pool_detail(srv)["extents allocated"].split(" of ")
    return int(allocated), int(total)


def wait_for(what, check, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def write_chunks(srv, start_mib: int, count_mib: int) -> None:
    with nbd_handle(srv, export="v") as h:
        for i in range(start_mib, start_mib + count_mib):
            h.pwrite(pattern_bytes(i, MiB), i * MiB)
        h.flush()


def check_chunks(srv, count_mib: int) -> None:
    with nbd_handle(srv, export="v") as h:
        for i in range(count_mib):
            assert h.pread(MiB, i * MiB) == pattern_bytes(i, MiB), f"MiB {i} differs"


def test_pool_grows_from_spares_at_low_water_and_keeps_them_across_restart(server_factory):
    srv = server_factory(spec(["spare1.img", "spare2.img"]))
    for name in ("spare1.img", "spare2.img"):
        (srv.data_dir / name).write_bytes(b"\0" * SPARE)
    _, first_total = extents(srv)
    assert pool_detail(srv)["low water"].startswith("50 %")
    wait_for("the spare count in status", lambda: pool_detail(srv)["spares for growth"] == "2")

    # Below the mark: no growth.
    write_chunks(srv, 0, 1)
    time.sleep(1.5)
    assert extents(srv)[1] == first_total
    # Across the mark: the first spare joins the concat.
    def grows_by_one_spare(spare, chunks, before, spares_left, children):
        write_chunks(srv, *chunks)
        allocated, _ = extents(srv)
        assert allocated * 2 > before, (allocated, before)
        total = wait_for(f"growth from {spare}", lambda: extents(srv)[1] > before and extents(srv)[1])
        # A 4 MiB spare less its 64 KiB label holds 63 extents of 64 KiB.
        assert total == before + (SPARE - 64 * 1024) // EXTENT
        assert pool_detail(srv)["spares for growth"] == str(spares_left)
        config = srv.config_path.read_text()
        assert f"children = {children}" in config, config
        return total, config

    second_total, config = grows_by_one_spare("spare1", (1, 1), first_total, 1, '["d0", "spare1"]')
    assert 'grow-from = ["spare2.img"]' in config, config
    assert "above its low-water mark" in srv.stderr_text() and "grew from a spare" in srv.stderr_text()

    # Across the mark again: the second spare; then none is left.
    third_total, config = grows_by_one_spare("spare2", (2, 3), second_total, 0, '["d0", "spare1", "spare2"]')
    assert "grow-from = []" in config, config
    assert 'path = "spare2.img"' in config, config
    # The new extents are used: 5 MiB mapped, more than the first disk held.
    assert extents(srv)[0] * EXTENT >= 5 * MiB > first_total * EXTENT
    check_chunks(srv, 5)

    srv.keep_config = True
    srv.restart()
    assert extents(srv)[1] == third_total
    check_chunks(srv, 5)
    write_chunks(srv, 5, 1)
    check_chunks(srv, 6)


def test_a_missing_spare_is_logged_and_the_pool_keeps_serving(server_factory):
    srv = server_factory(spec(["not-there.img"]))
    _, total = extents(srv)
    write_chunks(srv, 0, 2)
    wait_for("the refusal in the log", lambda: "spare not added" in srv.stderr_text())
    assert "not-there.img is not there" in srv.stderr_text()
    assert extents(srv)[1] == total
    # Refused once, not retried every second.
    time.sleep(2.5)
    assert srv.stderr_text().count("spare not added") == 1
    check_chunks(srv, 2)
    assert 'grow-from = ["not-there.img"]' in srv.config_path.read_text()
