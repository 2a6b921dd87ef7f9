"""A raw block device (a loop device over a file) as a Strata disk: size from the device,
data round trip, discard and write-zeroes through to the device, persistence."""

from __future__ import annotations

import os
import subprocess

import pytest

from harness import MiB, Disk, Export, ServerSpec, nbd_handle, pattern_bytes, requires_strata

SIZE = 64 * MiB


@pytest.fixture
def loop_device(workdir):
    if os.geteuid() != 0:
        pytest.fail("this test needs root for losetup (test.sh runs as root in CI)")
    backing = workdir / "backing.img"
    with open(backing, "wb") as f:
        f.truncate(SIZE)
    dev = subprocess.run(["losetup", "-f", "--show", str(backing)], check=True, capture_output=True,
                         text=True).stdout.strip()
    try:
        yield dev, backing
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


@requires_strata()
def test_loop_device_as_disk(server_factory, loop_device):
    dev, backing = loop_device
    srv = server_factory(ServerSpec(disks=[Disk("d0", SIZE, path=dev)], exports=[Export("vol", "d0")]))
    data = pattern_bytes(3, 4 * MiB)
    with nbd_handle(srv) as h:
        assert h.get_size() == SIZE, "the export takes the block device's size"
        h.pwrite(data, 8 * MiB)
        h.zero(MiB, 9 * MiB)  # zero the first MiB of the pattern
        h.trim(MiB, 11 * MiB)  # discard the last MiB (contents then unspecified)
        h.flush()
        assert h.pread(MiB, 9 * MiB) == bytes(MiB)
        assert h.pread(MiB, 10 * MiB) == data[2 * MiB:3 * MiB]
    assert srv.stop() == 0, "clean shutdown"
    with open(dev, "rb") as f:  # the bytes are on the device itself
        f.seek(8 * MiB)
        assert f.read(MiB) == data[:MiB]
        f.seek(10 * MiB)
        assert f.read(MiB) == data[2 * MiB:3 * MiB]
    srv.start()
    with nbd_handle(srv) as h:
        assert h.pread(MiB, 8 * MiB) == data[:MiB], "data survives a restart"
