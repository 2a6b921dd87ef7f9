"""qemu-img and qemu-io against a strata export."""

from __future__ import annotations

import json
import random

from harness import MiB, Disk, Export, ServerSpec, nbd_handle, run, sha256_file


def make_image(path, size=64 * MiB, seed=42):
    """Random data with zero runs of several sizes (some aligned, some not)."""
    rng = random.Random(seed)
    data = bytearray(rng.randbytes(size))
    for off, ln in [(0, 4096), (MiB, MiB), (5 * MiB + 17, 300000), (20 * MiB, 8 * MiB), (size - 2 * MiB, 2 * MiB)]:
        data[off:off + ln] = bytes(ln)
    for _ in range(50):
        off = rng.randrange(0, size - 65536) & ~4095
        data[off:off + 8192] = bytes(8192)
    path.write_bytes(data)
    return bytes(data)


def test_qemu_img_convert_compare_roundtrip(server_factory, workdir):
    srv = server_factory(ServerSpec(disks=[Disk("d0", 64 * MiB)], exports=[Export("vol", "d0")]))
    src = workdir / "src.img"
    make_image(src)
    uri = srv.uri()
    run(["qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, uri])
    r = run(["qemu-img", "compare", "-f", "raw", "-F", "raw", src, uri])
    assert "Images are identical" in r.stdout
    out = workdir / "out.img"
    run(["qemu-img", "convert", "-f", "raw", "-O", "raw", uri, out])
    assert out.stat().st_size == 64 * MiB
    assert sha256_file(out) == sha256_file(src)
    # compare must notice a difference, too
    with nbd_handle(srv) as h:
        h.pwrite(b"\x01", 33 * MiB + 5)
        h.flush()
    r = run(["qemu-img", "compare", "-f", "raw", "-F", "raw", src, uri], check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Content mismatch at offset 34603008" in r.stdout


def qemu_io(uri, *cmds, check=True):
    argv = ["qemu-io", "-f", "raw"]
    for c in cmds:
        argv += ["-c", c]
    argv.append(uri)
    r = run(argv, check=check)
    out = r.stdout + r.stderr
    if check:
        assert "Pattern verification failed" not in out, out
        assert "error" not in out.lower(), out
    return out


def test_qemu_io_patterns(server):
    uri = server.uri()
    qemu_io(uri,
            "write -P 0xab 0 1M",
            "read -P 0xab 0 1M",
            "write -P 0xcd 4097 12345",
            "read -P 0xab 0 4097",
            "read -P 0xcd 4097 12345",
            "read -P 0xab 16442 32768",
            "flush")
    # unaligned async I/O
    qemu_io(uri,
            "aio_write -P 0x11 1000001 70000",
            "aio_write -P 0x22 2000003 3",
            "aio_write -P 0x33 3000005 131072",
            "aio_flush",
            "aio_read -P 0x11 1000001 70000",
            "aio_read -P 0x22 2000003 3",
            "aio_read -P 0x33 3000005 131072",
            "aio_flush")
    # write -z and discard read back as zero
    qemu_io(uri,
            "write -P 0x44 8M 2M",
            "write -z 8M 512k",
            "read -P 0 8M 512k",
            "read -P 0x44 8704k 1536k",
            "discard 9M 1M",
            "read -P 0 9M 1M",
            "read -P 0x44 8704k 512k",
            "write -z -u 10M 4k",
            "flush")
    # the check itself works: a wrong pattern is reported
    out = qemu_io(uri, "read -P 0x99 0 4096", check=False)
    assert "Pattern verification failed" in out
    # data written through qemu-io is visible through libnbd
    with nbd_handle(server) as h:
        assert h.pread(3, 2000003) == b"\x22" * 3
        assert h.pread(4096, 0) == b"\xab" * 4096


def test_qemu_img_map_shows_discarded_zero(server):
    uri = server.uri()
    qemu_io(uri, "write -P 0x5a 0 32M", "flush")
    qemu_io(uri, "discard 8M 8M", "flush")
    r = run(["qemu-img", "map", "--output=json", "-f", "raw", uri])
    extents = json.loads(r.stdout)
    assert extents, r.stdout
    total = sum(e["length"] for e in extents)
    assert total == server.export_size()

    def covering(lo, hi):
        return [e for e in extents if e["start"] < hi and e["start"] + e["length"] > lo]

    for e in covering(0, 8 * MiB) + covering(16 * MiB, 32 * MiB):
        assert e["data"] and not e["zero"], (e, extents)
    disc = covering(8 * MiB, 16 * MiB)
    assert disc
    for e in disc:
        assert e["zero"], (e, extents)
    for e in covering(64 * MiB, server.export_size()):
        assert e["zero"], (e, extents)
    qemu_io(uri, "read -P 0x5a 0 8M", "read -P 0 8M 8M", "read -P 0x5a 16M 16M")
