"""Process lifecycle: persistence across restarts, signals, status, metrics,
config errors, default (config-less) mode."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import nbd
import pytest

from harness import (MiB, GiB, STRATA_BIN, Disk, Export, ServerSpec, close_handle, nbd_handle, on_the_default_port,
                     pattern_bytes, requires_strata, run, sha256_file)


def test_restart_persistence(server, workdir):
    src = workdir / "src.img"
    src.write_bytes(random.Random(77).randbytes(32 * MiB))
    run(["nbdcopy", src, server.uri()])
    tail = pattern_bytes(78, 4096)
    with nbd_handle(server) as h:
        h.pwrite(tail, server.export_size() - 4096)
    server.restart()  # asserts exit code 0
    out = workdir / "out.img"
    run(["nbdcopy", server.uri(), out])
    assert sha256_file(out, 32 * MiB) == sha256_file(src)
    with nbd_handle(server) as h:
        assert h.pread(4096, server.export_size() - 4096) == tail
    # and the backing file holds exactly that data (raw layout)
    assert sha256_file(server.disk_file(), 32 * MiB) == sha256_file(src)


def test_sigint_exits_zero(server):
    with nbd_handle(server) as h:
        h.pwrite(b"abc", 0)
    rc = server.stop(signal.SIGINT)
    assert rc == 0, f"exit {rc} on SIGINT"


def test_sigterm_under_load_keeps_acknowledged_writes(server):
    """SIGTERM while a client is writing: exit 0, and every write that was
    acknowledged before the shutdown is in the backing file."""
    acked = []
    stop = threading.Event()
    errors = []

    def writer():
        h = server.connect()
        try:
            i = 0
            while not stop.is_set() and i < 4000:
                h.pwrite(pattern_bytes(i, 65536), i * 65536)
                acked.append(i)
                i += 1
        except nbd.Error as e:
            errors.append(e)
        finally:
            close_handle(h)

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(0.7)
    rc = server.stop(signal.SIGTERM)
    stop.set()
    t.join(30)
    assert not t.is_alive()
    assert rc == 0, f"exit {rc} on SIGTERM under load"
    assert acked, "writer made no progress"
    with open(server.disk_file(), "rb") as f:
        for i in acked:
            f.seek(i * 65536)
            assert f.read(65536) == pattern_bytes(i, 65536), f"acknowledged block {i} lost"


# ---------------------------------------------------------------------------
# status and metrics


def find_node(nodes, name):
    for n in nodes:
        if n.get("name") == name:
            return n
        hit = find_node(n.get("children") or [], name)
        if hit:
            return hit
    return None


@requires_strata()
def test_status_json_and_counters(server_factory):
    srv = server_factory(ServerSpec(
        disks=[Disk("d0", 64 * MiB), Disk("d1", 8 * MiB)],
        exports=[Export("vol", "d0"), Export("ro", "d1", read_only=True)],
    ))
    st = srv.status()
    ex = {e["name"]: e for e in st["exports"]}
    assert set(ex) == {"vol", "ro"}
    assert ex["vol"]["device"] == "d0" and ex["vol"]["size"] == 64 * MiB and ex["vol"]["read_only"] is False
    assert ex["ro"]["device"] == "d1" and ex["ro"]["size"] == 8 * MiB and ex["ro"]["read_only"] is True
    node = find_node(st["devices"], "d0")
    assert node is not None, st["devices"]
    for k in ["name", "kind", "size", "health", "stats", "children"]:
        assert k in node, (k, node)
    assert node["size"] == 64 * MiB
    assert isinstance(node["children"], list)
    for d in ["read", "write"]:
        for k in ["ops", "bytes", "errors", "latency_us_mean"]:
            assert k in node["stats"][d], (d, k, node["stats"])
    r0, w0 = node["stats"]["read"], node["stats"]["write"]

    with nbd_handle(srv) as h:
        for i in range(10):
            h.pwrite(pattern_bytes(i, 65536), i * 65536)
        for i in range(5):
            h.pread(131072, i * 131072)
        h.flush()
    node = find_node(srv.status()["devices"], "d0")
    r1, w1 = node["stats"]["read"], node["stats"]["write"]
    assert w1["ops"] - w0["ops"] >= 10, (w0, w1)
    assert w1["bytes"] - w0["bytes"] >= 10 * 65536, (w0, w1)
    assert r1["ops"] - r0["ops"] >= 5, (r0, r1)
    assert r1["bytes"] - r0["bytes"] >= 5 * 131072, (r0, r1)
    assert w1["errors"] == 0 and r1["errors"] == 0
    assert w1["latency_us_mean"] > 0
    # the other device saw nothing
    n1 = find_node(srv.status()["devices"], "d1")
    assert n1["stats"]["write"]["ops"] == 0

    # same answer through --admin
    st2 = srv.status("--admin", srv.admin_sock)
    assert {e["name"] for e in st2["exports"]} == {"vol", "ro"}
    # human-readable form
    text = srv.status("--data-dir", str(srv.data_dir), json_out=False)
    assert "vol" in text and "d0" in text and "ro" in text


@requires_strata()
def test_metrics_endpoint(server_factory):
    srv = server_factory(ServerSpec(metrics=True))
    url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        body0 = r.read().decode()
    assert "strata_device_ops_total" in body0
    with nbd_handle(srv) as h:
        for i in range(20):
            h.pwrite(b"z" * 4096, i * 4096)
        h.flush()
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read().decode()
    samples = [ln for ln in body.splitlines() if ln.startswith("strata_device_ops_total")]
    assert samples, body
    total = sum(float(ln.rsplit(None, 1)[1]) for ln in samples)
    assert total >= 20, samples
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/nope", timeout=10)
    assert ei.value.code == 404


# ---------------------------------------------------------------------------
# config handling


BASE = """data-dir = "."
listen = ["unix:nbd.sock"]
admin = "admin.sock"

[[disk]]
name = "d0"
path = "disks/d0.img"
size = "16MiB"

[[export]]
name = "vol"
device = "d0"
"""


def serve_expect_failure(workdir, text):
    cfg = workdir / "bad.toml"
    cfg.write_text(text)
    try:
        r = subprocess.run([str(STRATA_BIN), "serve", "--config", str(cfg)], cwd=workdir, capture_output=True,
                           text=True, timeout=20, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail("strata serve kept running with a bad config")
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"bad config accepted:\n{text}\n{out}"
    assert "ready:" not in r.stdout
    return out


@requires_strata()
def test_bad_config_missing_field(workdir):
    text = BASE.replace('device = "d0"\n', "")
    out = serve_expect_failure(workdir, text)
    assert re.search(r"line \d+", out), out
    assert "device" in out, out


@requires_strata()
def test_bad_config_unknown_device(workdir):
    text = BASE.replace('device = "d0"', 'device = "nosuchdisk"')
    lines = text.splitlines()
    dev_line = 1 + next(i for i, ln in enumerate(lines) if "nosuchdisk" in ln)
    hdr_line = 1 + next(i for i, ln in enumerate(lines) if ln == "[[export]]")
    out = serve_expect_failure(workdir, text)
    assert "nosuchdisk" in out, out
    m = [int(x) for x in re.findall(r"line (\d+)", out)]
    assert any(hdr_line <= n <= dev_line for n in m), f"no line in {hdr_line}..{dev_line} named: {out}"


@requires_strata()
def test_bad_config_bad_size_value(workdir):
    text = BASE.replace('size = "16MiB"', 'size = "sixteen megs"')
    line = 1 + next(i for i, ln in enumerate(text.splitlines()) if "sixteen" in ln)
    out = serve_expect_failure(workdir, text)
    assert f"line {line}" in out, out
    assert "size" in out, out


@requires_strata()
def test_bad_config_syntax(workdir):
    text = BASE.replace('name = "vol"', 'name = "vol')
    line = 1 + next(i for i, ln in enumerate(text.splitlines()) if ln == 'name = "vol')
    out = serve_expect_failure(workdir, text)
    assert f"line {line}" in out, out


@requires_strata()
def test_bad_config_missing_file(workdir):
    r = subprocess.run([str(STRATA_BIN), "serve", "--config", str(workdir / "absent.toml")], capture_output=True,
                       text=True, timeout=20, stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    assert "absent.toml" in r.stdout + r.stderr


# ---------------------------------------------------------------------------
# paths and defaults


def spawn_and_wait_ready(argv, cwd, timeout=30):
    out = open(cwd / "spawn.stdout", "wb")
    err = open(cwd / "spawn.stderr", "wb")
    p = subprocess.Popen([str(a) for a in argv], cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(ln.startswith("ready:") for ln in (cwd / "spawn.stdout").read_text().splitlines()):
            return p
        if p.poll() is not None:
            break
        time.sleep(0.02)
    p.kill()
    p.wait()
    pytest.fail(f"not ready: rc={p.returncode}\n{(cwd / 'spawn.stderr').read_text()}")


def terminate(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            pytest.fail("did not exit on SIGTERM")
    return p.returncode


@requires_strata()
def test_relative_data_dir_resolves_against_config_folder(workdir):
    cfgdir = workdir / "etc"
    cfgdir.mkdir()
    (cfgdir / "strata.toml").write_text(BASE.replace('data-dir = "."', 'data-dir = "state"'))
    elsewhere = workdir / "cwd"
    elsewhere.mkdir()
    p = spawn_and_wait_ready([STRATA_BIN, "serve", "--config", cfgdir / "strata.toml"], elsewhere)
    try:
        sock = cfgdir / "state" / "nbd.sock"
        assert sock.exists(), list(workdir.rglob("*"))
        assert (cfgdir / "state" / "disks" / "d0.img").stat().st_size == 16 * MiB
        assert not (elsewhere / "state").exists()
        h = nbd.NBD()
        h.connect_uri(f"nbd+unix:///vol?socket={sock}")
        assert h.get_size() == 16 * MiB
        close_handle(h)
    finally:
        assert terminate(p) == 0


@requires_strata()
def test_default_mode_without_config(workdir):
    """`strata serve --data-dir DIR` with no config: a 16 GiB thin volume in a thin pool on
    the sparse disk0.img, exported as `default` on DIR/nbd.sock and 127.0.0.1:10809.  Runs in a
    private network namespace when possible so the fixed port cannot clash."""
    dd = workdir / "sd"
    argv, client = on_the_default_port([STRATA_BIN, "serve", "--data-dir", dd])
    p = spawn_and_wait_ready(argv, workdir)
    try:
        img = dd / "disks" / "disk0.img"
        st = img.stat()
        assert st.st_size == 16 * GiB
        assert st.st_blocks * 512 < 64 * MiB, "default disk is not sparse"
        assert (dd / "admin.sock").exists()
        h = nbd.NBD()
        h.connect_uri(f"nbd+unix:///?socket={dd / 'nbd.sock'}")
        assert h.get_size() == 16 * GiB
        # The thin volume advertises 512-byte blocks: write the last one.
        last = b"hello".ljust(512, b"\0")
        h.pwrite(last, 16 * GiB - 512)
        h.flush()
        close_handle(h)
        info = json.loads(run(client(p.pid, ["nbdinfo", "--json", "nbd://127.0.0.1:10809/default"])).stdout)
        assert info["exports"][0]["export-size"] == 16 * GiB
        h = nbd.NBD()
        h.connect_uri(f"nbd+unix:///default?socket={dd / 'nbd.sock'}")
        assert h.pread(512, 16 * GiB - 512) == last
        close_handle(h)
        r = run([STRATA_BIN, "status", "--data-dir", dd, "--json"])
        st = json.loads(r.stdout)
        assert [e["name"] for e in st["exports"]] == ["default"]
        assert st["exports"][0]["size"] == 16 * GiB
        pool = next(d for d in st["devices"] if d["kind"] == "thin-pool")
        # One write at the end of the volume maps exactly one extent.
        assert dict(pool["detail"])["extents allocated"].split()[0] == "1", pool
    finally:
        assert terminate(p) == 0
