"""Issue 12, the server's side: Strata must not destroy or hide data when a disk is missing,
stale, damaged, duplicated, or when its log pipe closes.

Each test drives the real `strata` binary with its own config file (the harness's ServerSpec
cannot say read-only disks, duplicate paths or disks in other folders), and reaches the
exports with real clients (nbdinfo, nbdcopy, python3-libnbd)."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from harness import (MiB, STRATA_BIN, unmount_fuse, ensure_simulator, Disk, Export, Layer, ServerSpec, nbd_handle, pattern_bytes, requires_strata,
                     run)

pytestmark = requires_strata()


def strata(*args, timeout=60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(STRATA_BIN), *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


class Proc:
    """A `strata serve` started by a test, its output in files, stopped at the end."""

    def __init__(self, workdir: Path, args: list, tag: str = "serve", stdout=None, stderr=None):
        self.out_path = workdir / f"{tag}.stdout"
        self.err_path = workdir / f"{tag}.stderr"
        out = stdout if stdout is not None else open(self.out_path, "wb")
        err = stderr if stderr is not None else open(self.err_path, "wb")
        self.proc = subprocess.Popen([str(STRATA_BIN), "serve", *map(str, args)], cwd=workdir,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        for f in (out, err):
            if not isinstance(f, int):
                f.close()

    def text(self) -> str:
        out = self.out_path.read_text(errors="replace") if self.out_path.exists() else ""
        err = self.err_path.read_text(errors="replace") if self.err_path.exists() else ""
        return f"--- stdout ---\n{out}\n--- stderr ---\n{err}"

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace") if self.err_path.exists() else ""

    def wait_ready(self, timeout=30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.out_path.exists() and "\nready:" in "\n" + self.out_path.read_text(errors="replace"):
                return
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before ready\n{self.text()}"
            time.sleep(0.02)
        raise AssertionError(f"not ready within {timeout}s\n{self.text()}")

    def wait_exit(self, timeout=30) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def procs():
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def serve(procs, workdir, *args, tag="serve", **kw) -> Proc:
    p = Proc(workdir, list(args), tag, **kw)
    procs.append(p)
    return p


def assembled(procs, workdir, data_dir: Path, *args, tag: str) -> Proc:
    """`strata serve --assemble ARGS` in `data_dir`, on the unix socket there alone: the
    default TCP port is one for the whole machine."""
    return serve(procs, workdir, "--data-dir", data_dir, "--listen", "unix:nbd.sock", "--assemble", *args, tag=tag)


def uri(data_dir: Path, export: str) -> str:
    return f"nbd+unix:///{export}?socket={data_dir}/nbd.sock"


def status(data_dir: Path) -> dict:
    r = strata("status", "--json", "--data-dir", data_dir)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def walk(node):
    yield node
    for child in node.get("children", []):
        yield from walk(child)


def node(data_dir: Path, name: str) -> dict:
    for root in status(data_dir)["devices"]:
        for n in walk(root):
            if n["name"] == name:
                return n
    raise AssertionError(f"no device {name} in status")


def write_config(data_dir: Path, body: str) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "strata.toml"
    path.write_text('data-dir = "."\nlisten = ["unix:nbd.sock"]\nadmin = "admin.sock"\n' + body)
    return path


def disk(name: str, path: str, size: str = "64MiB", extra: str = "") -> str:
    return f'\n[[disk]]\nname = "{name}"\npath = "{path}"\nsize = "{size}"\n{extra}'


def layer(name: str, kind: str, children: list[str], extra: str = "") -> str:
    kids = ", ".join(f'"{c}"' for c in children)
    return f'\n[[layer]]\nname = "{name}"\nkind = "{kind}"\nchildren = [{kids}]\n{extra}'


def export(name: str, device: str) -> str:
    return f'\n[[export]]\nname = "{name}"\ndevice = "{device}"\n'


def mirror_config(data_dir: Path, a="disks/a.img", b="disks/b.img") -> Path:
    return write_config(data_dir, disk("a", a) + disk("b", b)
                        + layer("m", "mirror", ["a", "b"], 'region = "1MiB"\n') + export("vol", "m"))


def put(h, data: bytes, offset: int, piece: int = 4 * MiB) -> None:
    for at in range(0, len(data), piece):
        h.pwrite(data[at:at + piece], offset + at)


def serves_alone(data_dir: Path, export: str, fill: bytes) -> dict:
    """Writes and flushes 4 KiB of `fill` at 0 of `export`, which must serve beside a refused
    layer, and returns the status, whose only export it must be."""
    with nbd_handle_uri(uri(data_dir, export)) as h:
        h.pwrite(fill * 4096, 0)
        h.flush()
    st = status(data_dir)
    assert [e["name"] for e in st["exports"]] == [export], st["exports"]
    return st


def write_flushed_and_stop(procs, workdir, config: Path, data: bytes) -> None:
    """Serves `config`, writes `data` at 0 of export "vol" and flushes it, then stops cleanly.
    The config lives in its data dir (see `write_config`), where the socket is."""
    p = serve(procs, workdir, "--config", config, tag="first")
    p.wait_ready()
    h = connect(config.parent)
    put(h, data, 0)
    h.flush()
    h.shutdown()
    assert p.stop() == 0


def get(h, length: int, offset: int, piece: int = 4 * MiB) -> bytes:
    return b"".join(h.pread(min(piece, length - at), offset + at) for at in range(0, length, piece))


def connect(data_dir: Path, export_name: str = "vol"):
    import nbd
    h = nbd.NBD()
    h.connect_uri(uri(data_dir, export_name))
    return h


# ---- case 6: a closed log pipe ------------------------------------------------------------


def test_a_closed_stdout_and_stderr_pipe_does_not_stop_the_server(procs, workdir):
    data_dir = workdir / "data"
    config = write_config(data_dir, disk("d0", "disks/d0.img") + export("vol", "d0"))
    # Both pipes' readers exit at once (as `strata serve | head -1` does once head has its
    # line): every later write to stdout or stderr fails with EPIPE.
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    os.close(out_r)
    os.close(err_r)
    p = serve(procs, workdir, "--config", config, stdout=out_w, stderr=err_w)
    os.close(out_w)
    os.close(err_w)
    deadline = time.monotonic() + 30
    while True:
        assert p.proc.poll() is None, f"the server died with a closed log pipe: exit {p.proc.returncode}"
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(data_dir / "nbd.sock"))
            s.close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the server never listened"
            time.sleep(0.05)
    info = json.loads(run(["nbdinfo", "--json", uri(data_dir, "vol")]).stdout)
    assert info["exports"][0]["export-size"] == 64 * MiB
    src = workdir / "src.img"
    src.write_bytes(pattern_bytes(61, 8 * MiB))
    run(["nbdcopy", src, uri(data_dir, "vol")])
    out = workdir / "out.img"
    run(["nbdcopy", uri(data_dir, "vol"), out])
    assert out.read_bytes()[:8 * MiB] == src.read_bytes()
    assert p.proc.poll() is None, f"the server died after serving: exit {p.proc.returncode}"
    # Shutting down logs too: it must still flush and exit 0.
    assert p.stop() == 0


# ---- case 5: one file as two mirror legs ----------------------------------------------------


@pytest.mark.parametrize("how", ["same", "dotdot", "symlink", "hardlink"])
def test_one_file_as_two_mirror_legs_is_refused(workdir, how):
    data_dir = workdir / "data"
    (data_dir / "disks").mkdir(parents=True)
    first = data_dir / "disks" / "a.img"
    first.write_bytes(b"")
    os.truncate(first, 64 * MiB)
    second = {"same": "disks/a.img", "dotdot": "disks/../disks/a.img",
              "symlink": "disks/b.img", "hardlink": "disks/b.img"}[how]
    if how == "symlink":
        (data_dir / "disks" / "b.img").symlink_to("a.img")
    if how == "hardlink":
        os.link(first, data_dir / "disks" / "b.img")
    config = mirror_config(data_dir, b=second)
    r = strata("serve", "--config", config, timeout=30)
    assert r.returncode != 0, f"served one file as two legs\n{r.stdout}\n{r.stderr}"
    # The error names the file, the line and column of the second disk's path, and the field.
    text = config.read_text()
    lines = text.splitlines()
    line = len(lines) - lines[::-1].index(f'path = "{second}"')  # the second disk's path
    assert f"{config}: line {line}, column" in r.stderr, r.stderr
    assert "field `path`" in r.stderr and "disk a" in r.stderr, r.stderr
    assert first.read_bytes()[:65536] == bytes(65536), "the file was written"


# ---- case 7: sizes, check, banner ----------------------------------------------------------


def assert_disk_size_refused(workdir, size: str) -> None:
    """Serving one disk of `size` is refused, naming the file, line and field, and creates no
    file (not even an empty one)."""
    data_dir = workdir / "data"
    config = write_config(data_dir, disk("d0", "disks/d0.img", size=size) + export("vol", "d0"))
    r = strata("serve", "--config", config, timeout=30)
    assert r.returncode != 0, r.stdout
    assert f"{config}: line 8, column" in r.stderr and "field `size`" in r.stderr, r.stderr
    assert not (data_dir / "disks" / "d0.img").exists(), "a disk file was left behind"


def test_a_zero_size_disk_is_refused_with_its_field(workdir):
    assert_disk_size_refused(workdir, "0")


def test_an_overflowing_size_creates_nothing_and_names_file_line_field(workdir):
    # 8 EiB fits in a u64 but not in a file offset (off_t): no file system takes it.
    assert_disk_size_refused(workdir, "8388608TiB")


def test_check_on_a_plain_file_says_it_is_not_a_strata_disk(workdir):
    plain = workdir / "plain.img"
    plain.write_bytes(bytes(4 * MiB))
    r = strata("check", plain)
    assert "not a Strata disk: no hierarchy label and no metadata superblock" in r.stdout, r.stdout + r.stderr
    assert "damaged" not in r.stdout, r.stdout
    assert r.returncode == 3, f"exit {r.returncode}: {r.stderr}"


def test_the_banner_says_read_only_for_a_read_only_disk(procs, workdir):
    data_dir = workdir / "data"
    (data_dir / "disks").mkdir(parents=True)
    (data_dir / "disks" / "d0.img").write_bytes(bytes(4 * MiB))
    # A read-only disk that does not exist is not created, even on a first start: empty and
    # unwritable, it could only hide a mistyped path.
    config = write_config(data_dir, disk("d0", "disks/d0.img", size="4MiB", extra="read-only = true\n")
                          + disk("gone", "disks/gone.img", size="4MiB", extra="read-only = true\n")
                          + export("vol", "d0") + export("gone", "gone"))
    p = serve(procs, workdir, "--config", config)
    p.wait_ready()
    out = p.out_path.read_text()
    assert 'export "vol": 4MiB, read-only' in out, out
    assert not (data_dir / "disks" / "gone.img").exists(), "a read-only disk was created"
    assert "read-only disk is never created" in p.stderr(), p.text()
    assert p.stop() == 0


# ---- case 4: a vanished member is not re-created -------------------------------------------


def test_a_vanished_mirror_leg_is_not_recreated(procs, workdir):
    data_dir = workdir / "data"
    config = mirror_config(data_dir, b="legs/b.img")
    data = pattern_bytes(41, 8 * MiB)
    write_flushed_and_stop(procs, workdir, config, data)
    # The leg's folder disappears (an unmounted mount point, a deleted member).
    (data_dir / "legs" / "b.img").unlink()
    (data_dir / "legs").rmdir()
    p = serve(procs, workdir, "--config", config, tag="second")
    deadline = time.monotonic() + 30
    while p.proc.poll() is None and "ready:" not in p.out_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, p.text()
        time.sleep(0.05)
    assert not (data_dir / "legs").exists(), "the missing leg's folder was created"
    if p.proc.poll() is None:
        # Served without --degraded: it may not look healthy.
        assert node(data_dir, "m")["health"] != "ok", node(data_dir, "m")
        assert p.stop() == 0
    assert "b" in p.stderr() and "missing" in p.stderr(), p.text()
    # With --degraded the data is there, on one leg, and the leg still is not fabricated.
    p = serve(procs, workdir, "--config", config, "--degraded", tag="degraded")
    p.wait_ready()
    assert "degraded" in p.stderr() and "WARN" in p.stderr(), p.text()
    h = connect(data_dir)
    assert get(h, len(data), 0) == data
    h.shutdown()
    assert node(data_dir, "m")["health"] == "degraded", node(data_dir, "m")
    assert not (data_dir / "legs").exists()
    assert p.stop() == 0


def test_create_true_makes_a_new_disk_in_an_existing_config(procs, workdir):
    data_dir = workdir / "data"
    config = write_config(data_dir, disk("d0", "disks/d0.img") + export("vol", "d0"))
    p = serve(procs, workdir, "--config", config, tag="first")
    p.wait_ready()
    assert p.stop() == 0
    # A disk added later without `create = true` is refused: it may be a typo.
    config.write_text(config.read_text() + disk("d1", "new/d1.img") + export("other", "d1"))
    p = serve(procs, workdir, "--config", config, tag="typo")
    p.wait_ready()
    assert not (data_dir / "new").exists()
    assert "d1" in p.stderr() and "create = true" in p.stderr(), p.text()
    assert [e["name"] for e in status(data_dir)["exports"]] == ["vol"]
    assert p.stop() == 0
    config.write_text(config.read_text().replace('path = "new/d1.img"', 'path = "new/d1.img"\ncreate = true'))
    p = serve(procs, workdir, "--config", config, tag="create")
    p.wait_ready()
    assert (data_dir / "new" / "d1.img").stat().st_size == 64 * MiB
    assert sorted(e["name"] for e in status(data_dir)["exports"]) == ["other", "vol"]
    assert p.stop() == 0


# ---- case 1 (server side): start policy flags ------------------------------------------------


def test_format_names_an_unknown_layer_precisely(workdir):
    data_dir = workdir / "data"
    config = mirror_config(data_dir)
    r = strata("serve", "--config", config, "--format", "nosuch", timeout=30)
    assert r.returncode != 0
    assert '--format nosuch: no layer named "nosuch"' in r.stderr and "m" in r.stderr, r.stderr
    assert not (data_dir / "disks").exists(), "disks were created before the flags were checked"


# ---- a layer that refuses to open does not take the server down ------------------------------


def test_a_refused_device_leaves_the_others_serving(procs, workdir):
    data_dir = workdir / "data"
    (data_dir / "disks").mkdir(parents=True)
    # d1 holds somebody's data and no label: the slice over it must not start (nor label it).
    (data_dir / "disks" / "d1.img").write_bytes(b"precious" * (8 * MiB // 8))
    config = write_config(data_dir, disk("d0", "disks/d0.img") + disk("d1", "disks/d1.img", size="8MiB")
                          + layer("part", "slice", ["d1"]) + export("vol", "d0") + export("theirs", "part"))
    p = serve(procs, workdir, "--config", config)
    p.wait_ready()
    err = p.stderr()
    assert "ERROR" in err and "part" in err and "refusing to overwrite" in err, err
    assert f"strata check {data_dir / 'disks' / 'd1.img'}" in err, err
    st = serves_alone(data_dir, "vol", b"x")
    refused = next(d for d in st["devices"] if d["name"] == "part")
    assert refused["health"] == "refused" and "refusing to overwrite" in json.dumps(refused), refused
    text = strata("status", "--data-dir", data_dir).stdout
    assert "part" in text and "refused" in text, text
    assert p.stop() == 0
    assert (data_dir / "disks" / "d1.img").read_bytes()[:8] == b"precious"


class nbd_handle_uri:
    def __init__(self, u):
        import nbd
        self.h = nbd.NBD()
        self.h.connect_uri(u)

    def __enter__(self):
        return self.h

    def __exit__(self, *exc):
        self.h.shutdown()


def thin_and_plain(data_dir: Path) -> Path:
    return write_config(data_dir, disk("d0", "disks/d0.img") + disk("t", "disks/t.img")
                        + layer("pool", "thin-pool", ["t"], 'volumes = [{ name = "v", size = "32MiB" }]\n')
                        + export("vol", "d0") + export("thin", "pool/v"))


@pytest.mark.parametrize("damage", ["garbage", "zeros"])
def test_damaged_thin_metadata_refuses_that_pool_and_keeps_others_serving(procs, workdir, damage):
    """Case 2. Waits on the layers work for `zeros` (a pool must not format over a region that
    held metadata: today it formats a new empty pool)."""
    data_dir = workdir / "data"
    config = thin_and_plain(data_dir)
    p = serve(procs, workdir, "--config", config, tag="first")
    p.wait_ready()
    data = pattern_bytes(71, 1 * MiB)
    with nbd_handle_uri(uri(data_dir, "thin")) as h:
        h.pwrite(data, 0)
        h.flush()
    assert p.stop() == 0
    t = data_dir / "disks" / "t.img"
    with open(t, "r+b") as f:
        f.seek(64 * 1024)  # the metadata region starts after the hierarchy label
        f.write(pattern_bytes(72, 256 * 1024) if damage == "garbage" else bytes(256 * 1024))
    p = serve(procs, workdir, "--config", config, tag="second")
    p.wait_ready()
    err = p.stderr()
    assert "ERROR" in err and "pool" in err and f"strata check {t}" in err, err
    with nbd_handle_uri(uri(data_dir, "vol")) as h:
        h.pwrite(b"y" * 4096, 0)
    st = status(data_dir)
    assert [e["name"] for e in st["exports"]] == ["vol"], st["exports"]
    pool = next(d for d in st["devices"] if d["name"] == "pool")
    assert pool["health"] == "refused", pool
    assert [c["name"] for c in pool["children"]] == ["t"], pool
    assert p.stop() == 0


# ---- case 1: a stale mirror leg ------------------------------------------------------------


def mirror_with_a_stale_leg(procs, workdir, size: int, seed: int):
    """A mirror of a and b; data written; `strata fail-member m b`; new data written over it;
    server stopped. Returns (data_dir, a, b, the new data): b holds the old data, stale."""
    data_dir = workdir / "data"
    p = serve(procs, workdir, "--config", mirror_config(data_dir), tag="first")
    p.wait_ready()
    h = connect(data_dir)
    put(h, pattern_bytes(seed, size), 0)
    h.flush()
    h.shutdown()
    r = strata("fail-member", "--data-dir", data_dir, "m", "b")
    assert r.returncode == 0, r.stderr
    new = pattern_bytes(seed + 1, size)
    h = connect(data_dir)
    put(h, new, 0)
    h.flush()
    h.shutdown()
    assert p.stop() == 0
    return data_dir, data_dir / "disks" / "a.img", data_dir / "disks" / "b.img", new


def test_a_stale_mirror_leg_is_never_served_as_current(procs, workdir):
    _, a, b, new = mirror_with_a_stale_leg(procs, workdir, 4 * MiB, 81)
    # b alone is stale: refused without --degraded.
    alone = workdir / "alone"
    p = assembled(procs, workdir, alone, b, tag="alone")
    rc = p.wait_exit(30)
    assert rc != 0, f"served the stale leg alone\n{p.text()}"
    assert "strata check" in p.stderr(), p.text()
    assert "--degraded" in p.stderr(), p.text()
    # a and b together, in either order: a wins, b stays faulty, never b's old data.
    for order, tag in (((a, b), "both"), ((b, a), "both-reversed")):
        both = workdir / tag
        p = assembled(procs, workdir, both, *order, tag=tag)
        p.wait_ready()
        h = connect(both)
        seen = get(h, len(new), 0)
        h.shutdown()
        assert seen == new, f"served the stale leg's data ({tag})"
        assert node(both, "m")["health"] == "degraded", node(both, "m")
        assert p.stop() == 0


def test_a_stale_leg_started_degraded_is_a_split_brain_never_a_silent_winner(procs, workdir):
    """The operator starts the stale leg alone with --degraded (it then records the other as
    failed); each leg now records the other as failed, and assembling both is refused,
    whatever the order: neither leg's data silently wins."""
    _, a, b, new = mirror_with_a_stale_leg(procs, workdir, 2 * MiB, 91)
    alone = workdir / "alone"
    p = assembled(procs, workdir, alone, b, "--degraded", tag="alone")
    p.wait_ready()
    assert "degraded" in p.stderr(), p.text()
    assert node(alone, "m")["health"] == "degraded", node(alone, "m")
    assert p.stop() == 0
    for order, tag in (((a, b), "both"), ((b, a), "both-reversed")):
        p = assembled(procs, workdir, workdir / tag, *order, tag=tag)
        assert p.wait_exit(30) != 0, f"assembled a split brain ({tag})\n{p.text()}"
        assert "split brain" in p.stderr(), p.text()
    # Choosing a explicitly still works, and serves a's data.
    p = assembled(procs, workdir, workdir / "chosen", a, "--degraded", tag="chosen")
    p.wait_ready()
    h = connect(workdir / "chosen")
    assert get(h, len(new), 0) == new
    h.shutdown()
    assert p.stop() == 0


def test_a_damaged_label_copy_is_reported_and_rewritten(procs, workdir):
    data_dir = workdir / "data"
    config = mirror_config(data_dir)
    p = serve(procs, workdir, "--config", config, tag="first")
    p.wait_ready()
    assert p.stop() == 0
    a = data_dir / "disks" / "a.img"
    with open(a, "r+b") as f:
        f.seek(32 * 1024 + 40)  # inside copy B's JSON
        byte = f.read(1)
        f.seek(32 * 1024 + 40)
        f.write(bytes([byte[0] ^ 0x20]))
    r = strata("check", a)
    assert "label is damaged" in r.stdout, r.stdout + r.stderr
    p = serve(procs, workdir, "--config", config, tag="second")
    p.wait_ready()
    assert "rewriting both" in p.stderr(), p.text()
    assert p.stop() == 0
    r = strata("check", a)
    assert "label is damaged" not in r.stdout, r.stdout


# ---- case 1 tail: check --repair -----------------------------------------------------------


def test_check_repair_rewrites_nothing_when_clean(procs, workdir):
    data_dir = workdir / "data"
    config = thin_and_plain(data_dir)
    p = serve(procs, workdir, "--config", config)
    p.wait_ready()
    assert p.stop() == 0
    t = data_dir / "disks" / "t.img"
    before = t.read_bytes()[:4 * MiB]
    r = strata("check", "--repair", t)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "clean" in r.stdout, r.stdout
    assert t.read_bytes()[:4 * MiB] == before, "check --repair wrote to a clean disk"


def test_check_repair_refuses_one_member_of_a_mirror(procs, workdir):
    data_dir = workdir / "data"
    config = mirror_config(data_dir)
    write_flushed_and_stop(procs, workdir, config, pattern_bytes(91, 2 * MiB))
    a, b = data_dir / "disks" / "a.img", data_dir / "disks" / "b.img"
    before = (a.read_bytes()[:2 * MiB], b.read_bytes()[:2 * MiB])
    r = strata("check", "--repair", b)
    assert r.returncode != 0, r.stdout
    assert f"{b} is member b of mirror m" in r.stderr and "missing here: a" in r.stderr, r.stderr
    assert (a.read_bytes()[:2 * MiB], b.read_bytes()[:2 * MiB]) == before, "a member was rewritten"
    # With every member present it checks both (and rewrites nothing: they are clean).
    r = strata("check", "--repair", a, b)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (a.read_bytes()[:2 * MiB], b.read_bytes()[:2 * MiB]) == before


def damage_older_superblock_copy(path: Path) -> None:
    """Flips bytes inside the older metadata superblock copy (4 KiB blocks after the 64 KiB
    label), not its magic: a damaged copy that recovery reads past and a repair rewrites.
    (Damage to the newer copy, with a journal after it, is real damage: check refuses it.)"""
    def flip(copy: int) -> None:
        with open(path, "r+b") as f:
            f.seek(64 * 1024 + copy * 4096 + 64)
            block = f.read(64)
            f.seek(64 * 1024 + copy * 4096 + 64)
            f.write(bytes(b ^ 0xFF for b in block))
    flip(0)
    if strata("check", path).returncode != 0:
        flip(0)  # restore it: copy A was the newer
        flip(1)
    assert strata("check", path).returncode == 0


def test_check_repair_of_a_mirror_repairs_all_members_together_or_nothing(procs, workdir):
    data_dir = workdir / "data"
    config = mirror_config(data_dir)
    data = pattern_bytes(92, 2 * MiB)
    write_flushed_and_stop(procs, workdir, config, data)
    a, b = data_dir / "disks" / "a.img", data_dir / "disks" / "b.img"
    damage_older_superblock_copy(a)
    r = strata("check", a)
    assert r.returncode == 0 and "warning: superblock copy" in r.stdout, r.stdout + r.stderr
    damaged = a.read_bytes()[:1 * MiB]
    r = strata("check", "--repair", a)
    assert r.returncode != 0 and "missing here: b" in r.stderr, r.stdout + r.stderr
    assert a.read_bytes()[:1 * MiB] == damaged, "one member was repaired alone"
    r = strata("check", "--repair", a, b)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("repaired") == 2, r.stdout
    r = strata("check", a, b)
    assert r.returncode == 0 and r.stdout.count("clean") == 2 and "warning" not in r.stdout, r.stdout
    p = serve(procs, workdir, "--config", config, tag="after")
    p.wait_ready()
    h = connect(data_dir)
    assert get(h, len(data), 0) == data
    h.shutdown()
    assert node(data_dir, "m")["health"] == "ok", node(data_dir, "m")
    assert p.stop() == 0


def test_check_repair_refuses_members_at_different_generations(procs, workdir):
    data_dir = workdir / "data"
    config = mirror_config(data_dir)
    p = serve(procs, workdir, "--config", config)
    p.wait_ready()
    assert strata("fail-member", "--data-dir", data_dir, "m", "b").returncode == 0
    h = connect(data_dir)
    put(h, pattern_bytes(93, 2 * MiB), 0)
    h.flush()
    h.shutdown()
    assert p.stop() == 0
    a, b = data_dir / "disks" / "a.img", data_dir / "disks" / "b.img"
    damage_older_superblock_copy(a)
    before = (a.read_bytes()[:1 * MiB], b.read_bytes()[:1 * MiB])
    r = strata("check", "--repair", a, b)
    assert r.returncode != 0 and "do not agree" in r.stderr, r.stdout + r.stderr
    assert (a.read_bytes()[:1 * MiB], b.read_bytes()[:1 * MiB]) == before, "a member was rewritten"


def test_a_raid5_that_lost_two_members_is_refused_and_the_rest_serves(procs, workdir):
    data_dir = workdir / "data"
    config = write_config(data_dir, disk("p", "disks/p.img") + "".join(disk(f"r{i}", f"disks/r{i}.img")
                                                                      for i in range(3))
                          + layer("r5", "raid5", ["r0", "r1", "r2"], 'chunk = "64KiB"\n')
                          + export("plain", "p") + export("vol", "r5"))
    p = serve(procs, workdir, "--config", config, tag="first")
    p.wait_ready()
    assert p.stop() == 0
    for i in (1, 2):
        (data_dir / "disks" / f"r{i}.img").unlink()
    p = serve(procs, workdir, "--config", config, "--degraded", tag="second")
    p.wait_ready()
    err = p.stderr()
    assert "ERROR" in err and "raid5 r5" in err and "does not exist" in err, err
    assert f"strata check {data_dir / 'disks' / 'r0.img'}" in err, err
    for i in (1, 2):
        assert not (data_dir / "disks" / f"r{i}.img").exists(), "a vanished member was re-created"
    st = serves_alone(data_dir, "plain", b"z")
    r5 = next(d for d in st["devices"] if d["name"] == "r5")
    assert r5["health"] == "refused" and [c["name"] for c in r5["children"]] == ["r0"], r5
    text = strata("status", "--data-dir", data_dir).stdout
    assert "r5 (raid5)" in text and "refused" in text and "r0" in text, text
    assert p.stop() == 0


# ---- the file system under the disks fills up ---------------------------------------------


@pytest.fixture
def small_fs(workdir):
    """A 40 MiB tmpfs: sparse disk files on it run out of room long before their size."""
    mount = workdir / "small"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40M", "tmpfs", str(mount)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_file_system_under_a_thin_pool_fails_writes_and_loses_nothing_flushed(procs, workdir, small_fs):
    """The disk's file cannot grow (ENOSPC from the host): writes fail with an error, the
    server keeps serving, and after a restart with room again every flushed byte is there."""
    data_dir = workdir / "data"
    config = write_config(data_dir, f'\n[[disk]]\nname = "t"\npath = "{small_fs}/t.img"\nsize = "256MiB"\n'
                          + layer("pool", "thin-pool", ["t"], 'volumes = [{ name = "v", size = "200MiB" }]\n')
                          + export("thin", "pool/v"))
    p = serve(procs, workdir, "--config", config, tag="first")
    p.wait_ready()
    kept = pattern_bytes(101, 8 * MiB)
    import nbd
    h = connect(data_dir, "thin")
    put(h, kept, 0)
    h.flush()
    failed = None
    for at in range(8 * MiB, 200 * MiB, MiB):
        try:
            h.pwrite(pattern_bytes(at, MiB), at)
            h.flush()
        except nbd.Error as e:
            failed = e
            break
    assert failed is not None, "40 MiB of tmpfs took 200 MiB of writes"
    assert get(h, len(kept), 0) == kept, "flushed data changed when the disk filled"
    h.shutdown()
    assert p.proc.poll() is None, f"the server died when its disk filled\n{p.text()}"
    disk_node = next(n for n in walk(node(data_dir, "pool")) if n["kind"] == "file")
    assert disk_node["stats"]["write"]["errors"] >= 1, disk_node  # status answers, and shows it
    assert p.stop() == 0
    subprocess.run(["mount", "-o", "remount,size=400M", str(small_fs)], check=True)
    p = serve(procs, workdir, "--config", config, tag="second")
    p.wait_ready()
    h = connect(data_dir, "thin")
    assert get(h, len(kept), 0) == kept, "flushed data lost after the disk filled"
    h.pwrite(pattern_bytes(7, MiB), 100 * MiB)  # and the pool takes writes again
    h.flush()
    h.shutdown()
    assert p.stop() == 0
    r = strata("check", small_fs / "t.img")
    assert r.returncode == 0, r.stdout + r.stderr


# ---- a sync of the disk fails ---------------------------------------------------------------


@pytest.fixture
def failing_sync_file(workdir):
    """A file whose fdatasync fails with EIO while a trigger file exists: nbdfuse's file over
    nbdkit's eval plugin, whose flush fails then (its error filter cannot fail flushes).
    Linux reports a failed sync once and the next succeeds: what a disk must not believe."""
    back = workdir / "failing-back.img"
    with open(back, "wb") as f:
        f.truncate(64 * MiB)
    trigger = workdir / "sync-fails"
    sock = workdir / "failing.sock"
    fusedir = workdir / "failing-fuse"
    fusedir.mkdir()
    log = open(workdir / "failing-sync.log", "wb")
    nbdkit = subprocess.Popen(
        ["nbdkit", "-f", "-U", str(sock), "eval",
         f"get_size=echo {64 * MiB}", "can_write=exit 0", "can_flush=exit 0",
         f"pread=dd if={back} skip=$4 count=$3 iflag=skip_bytes,count_bytes status=none",
         f"pwrite=dd of={back} seek=$4 oflag=seek_bytes conv=notrunc status=none",
         f"flush=if [ -e {trigger} ]; then echo 'EIO the test failed this flush' >&2; exit 1; fi"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    fuse = None
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert nbdkit.poll() is None and time.monotonic() < deadline, "nbdkit did not start"
            time.sleep(0.05)
        fuse = subprocess.Popen(["nbdfuse", str(fusedir), f"nbd+unix:///?socket={sock}"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        path = fusedir / "nbd"
        while not path.exists():
            assert fuse.poll() is None and time.monotonic() < deadline, "nbdfuse did not start"
            time.sleep(0.05)
        yield path, trigger
    finally:
        if fuse is not None:
            unmount_fuse(fusedir, fuse)
        nbdkit.kill()
        nbdkit.wait()
        log.close()


def test_after_a_failed_sync_of_a_disk_no_flush_succeeds_until_it_is_opened_again(failing_sync_file, procs, workdir):
    """A flush whose fdatasync fails answers EIO, and so does every flush after it, though the
    file's next fdatasync succeeds: the kernel may have dropped the pages that failed, so
    nothing written before can be vouched for. Reads go on, status shows the disk failed and
    why, and a server started again over the same file flushes again. (`failing_sync_file`
    comes first so that it is torn down last, after the servers that hold its file.)"""
    import nbd
    path, trigger = failing_sync_file
    data_dir = workdir / "data"
    config = write_config(data_dir, disk("d", str(path)) + export("plain", "d"))
    p = serve(procs, workdir, "--config", config, tag="first")
    p.wait_ready()
    h = connect(data_dir, "plain")
    h.pwrite(b"a" * 4096, 0)
    h.flush()
    trigger.touch()
    h.pwrite(b"b" * 4096, 4096)
    with pytest.raises(nbd.Error) as failed:
        h.flush()
    assert failed.value.errnum == errno.EIO, failed.value
    trigger.unlink()
    h.pwrite(b"c" * 4096, 8192)
    with pytest.raises(nbd.Error) as later:
        h.flush()
    assert later.value.errnum == errno.EIO, later.value
    assert h.pread(4096, 0) == b"a" * 4096, "reads stop after a failed sync"
    h.shutdown()
    assert p.proc.poll() is None, f"the server died when a sync failed\n{p.text()}"
    assert "an earlier sync of it failed" in p.stderr(), p.stderr()
    files = [n for root in status(data_dir)["devices"] for n in walk(root) if n["kind"] == "file"]
    assert [f["health"] for f in files] == ["failed"], files
    assert "sync_failed" in json.dumps(files[0]["detail"]), files
    # The final flush at shutdown fails too, and the exit status says so.
    assert p.stop() == 1, p.text()
    assert "final flush failed" in p.stderr(), p.stderr()
    p = serve(procs, workdir, "--config", config, tag="second")
    p.wait_ready()
    h = connect(data_dir, "plain")
    h.pwrite(b"d" * 4096, 12288)
    h.flush()
    assert h.pread(4096, 0) == b"a" * 4096
    h.shutdown()
    assert p.stop() == 0


def test_client_commands_survive_a_closed_stdout():
    """`strata sim models | head -0`-like: the reader is gone before the first write. The
    command must finish its work and exit normally, not abort on EPIPE (panic = abort)."""
    ensure_simulator()
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([str(STRATA_BIN), "sim", "models"], stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    assert r.returncode == 0, (r.returncode, r.stderr.decode(errors="replace"))
