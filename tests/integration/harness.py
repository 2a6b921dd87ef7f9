"""Harness for the Strata end-to-end suite (servers, clients, helpers).

Every test talks to a real `strata serve` process started from a config file
the fixture writes.  The binary is taken from $STRATA_BIN (default
<repo>/target/release/strata); nothing is built here (test.sh builds).

For developing the harness without a strata binary, STRATA_TEST_SERVER=qemu-nbd
runs single-export configurations on qemu-nbd instead; tests that need
strata-only features (several exports, status, metrics, config errors) skip in
that mode.  The committed suite and CI always use strata.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STRATA_BIN = Path(os.environ.get("STRATA_BIN", REPO / "target" / "release" / "strata"))
SERVER_KIND = os.environ.get("STRATA_TEST_SERVER", "strata")
READY_TIMEOUT = float(os.environ.get("STRATA_READY_TIMEOUT", "30"))
STOP_TIMEOUT = 30.0

MiB = 1024 * 1024
GiB = 1024 * MiB


def size_str(n: int) -> str:
    if n % GiB == 0:
        return f"{n // GiB}GiB"
    if n % MiB == 0:
        return f"{n // MiB}MiB"
    return str(n)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


DEFAULT_TCP = "127.0.0.1:10809"


def on_the_default_port(argv):
    """`argv` starts a server that binds the default TCP listener, 127.0.0.1:10809: a fixed
    port, which another server on this machine (another test run) may hold. Returns the argv
    to start and `client(pid, cmd)`, the argv that runs a client command `cmd` where the
    server (its pid) listens. The server runs in a private network namespace when possible
    (root, unshare, nsenter, ip), else as given if the port is free; else the test is skipped."""
    argv = [str(a) for a in argv]
    if os.geteuid() == 0 and all(shutil.which(t) for t in ["unshare", "nsenter", "ip"]):
        wrapped = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
        return wrapped, lambda pid, cmd: ["nsenter", "-t", str(pid), "-n", *map(str, cmd)]
    if port_free(10809):
        return argv, lambda pid, cmd: [str(c) for c in cmd]
    pytest.skip(f"{DEFAULT_TCP} is in use and no network namespace is available")


def toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def toml_value(val) -> str:
    if isinstance(val, bool):
        return "true" if val else "false"
    if isinstance(val, (int, float)):
        return str(val)
    if isinstance(val, list):
        return f"[{', '.join(toml_str(str(v)) for v in val)}]"
    return toml_str(str(val))


def toml_table(kind: str, fields: dict) -> list:
    """A `[[kind]]` table's lines, a blank line first; fields whose value is None are left out."""
    return ["", f"[[{kind}]]"] + [f"{k} = {toml_value(v)}" for k, v in fields.items() if v is not None]


@dataclass
class Disk:
    name: str = "d0"
    size: int = 256 * MiB
    path: str | None = None  # default disks/<name>.img (relative to data-dir)
    direct: bool = False
    # A remote disk (`uri = ...`, docs/remote-disks.md): no path; `size` is the export's, for
    # the tests' own arithmetic only.
    uri: str | None = None
    timeout: str | None = None
    connections: int | None = None
    # An nbds:// disk's TLS files (absolute paths) and the name to check the server against.
    tls_ca: str | None = None
    tls_certificate: str | None = None
    tls_key: str | None = None
    tls_name: str | None = None
    # A shared volume (`shared = ...`, docs/shared-volumes.md): its name in the cluster's
    # catalog and the cluster's etcd endpoints; `size` is the volume's, for arithmetic only.
    shared: str | None = None
    etcd: list[str] | None = None
    cluster: str | None = None
    member: str | None = None
    lease: str | None = None
    # A benchmark's baseline only: the shared volume written through, without intervals.
    unsafe_without_intervals: bool = False

    @property
    def rel_path(self) -> str:
        return self.path if self.path is not None else f"disks/{self.name}.img"


@dataclass
class Export:
    name: str = "vol"
    device: str = "d0"
    read_only: bool = False
    description: str | None = None
    # Client identities (names in their TLS certificates) that may open the export.
    allow: list[str] | None = None


@dataclass
class Volume:
    name: str
    size: int


@dataclass
class Layer:
    """A `[[layer]]` section (a thin pool); its volumes are devices `<name>/<volume>`."""
    name: str = "pool"
    kind: str = "thin-pool"
    children: list[str] = field(default_factory=lambda: ["d0"])
    extent: int | None = None
    metadata_size: int | None = None
    commit_interval_ms: int | None = None
    volumes: list[Volume] = field(default_factory=list)
    # Any other option of the kind: strings are quoted, numbers and booleans written as is.
    options: dict = field(default_factory=dict)


@dataclass
class ServerSpec:
    disks: list[Disk] = field(default_factory=lambda: [Disk()])
    exports: list[Export] = field(default_factory=lambda: [Export()])
    unix: bool = True
    tcp: bool = False
    metrics: bool = False
    layers: list[Layer] = field(default_factory=list)
    # `[tls]`: {"mode": ..., "certificate": ..., "key": ..., "client-ca": ...}
    tls: dict | None = None
    # Run inside this network namespace (a host of netns.py), listening on its address.
    netns: str | None = None
    host: str = "127.0.0.1"


def pid_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Server:
    """A running NBD server (strata, or qemu-nbd when developing the harness)."""

    def __init__(self, workdir: Path, spec: ServerSpec, name: str = "srv",
                 binary: Path | None = None):
        self.spec = spec
        self.binary = binary or STRATA_BIN  # a benchmark may serve from another build
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.data_dir / "strata.toml"
        self.sock = str(self.data_dir / "nbd.sock")
        self.admin_sock = str(self.data_dir / "admin.sock")
        self.tcp_port = free_port() if spec.tcp else None
        self.metrics_port = free_port() if spec.metrics else None
        self.stdout_path = workdir / f"{name}.stdout"
        self.stderr_path = workdir / f"{name}.stderr"
        self.proc: subprocess.Popen | None = None
        self.kind = SERVER_KIND
        self.history: list[str] = []  # stderr of earlier runs (restarts)
        self.stopped = False  # stopped on purpose by the test (which checks the exit code)
        self.keep_config = False  # set once the server has rewritten its config (reconfiguration)

    def write_config(self) -> None:
        # After an online reconfiguration the server's own edits of the file are the truth.
        if not (self.keep_config and self.config_path.exists()):
            self.config_path.write_text(self.config_text())

    # ---- addressing -------------------------------------------------------
    def uri(self, export: str | None = None) -> str:
        export = self.spec.exports[0].name if export is None else export
        return f"nbd+unix:///{export}?socket={self.sock}"

    def tcp_uri(self, export: str | None = None) -> str:
        assert self.tcp_port is not None, "server was not started with tcp=True"
        export = self.spec.exports[0].name if export is None else export
        return f"nbd://{self.spec.host}:{self.tcp_port}/{export}"

    def disk_file(self, name: str = "d0") -> Path:
        for d in self.spec.disks:
            if d.name == name:
                p = Path(d.rel_path)
                return p if p.is_absolute() else self.data_dir / p
        raise KeyError(name)

    def export_size(self, export: str | None = None) -> int:
        export = self.spec.exports[0].name if export is None else export
        for e in self.spec.exports:
            if e.name == export:
                for d in self.spec.disks:
                    if d.name == e.device:
                        return d.size
        raise KeyError(export)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_kib(self) -> int:
        return pid_rss_kib(self.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ---- config -----------------------------------------------------------
    def config_text(self) -> str:
        s = self.spec
        listen = []
        if s.unix:
            listen.append('"unix:nbd.sock"')
        if s.tcp:
            listen.append(f'"tcp:{s.host}:{self.tcp_port}"')
        lines = [
            "# written by tests/integration/conftest.py",
            'data-dir = "."',
            f"listen = [{', '.join(listen)}]",
            'admin = "admin.sock"',
        ]
        if s.metrics:
            lines.append(f'metrics = "127.0.0.1:{self.metrics_port}"')
        for d in s.disks:
            if d.shared is not None:
                lines += toml_table("disk", {"name": d.name, "shared": d.shared, "etcd": d.etcd,
                                             "cluster": d.cluster, "member": d.member,
                                             "timeout": d.timeout, "lease": d.lease,
                                             "unsafe-without-intervals":
                                                 d.unsafe_without_intervals or None})
                continue
            if d.uri is not None:
                lines += toml_table("disk", {"name": d.name, "uri": d.uri, "timeout": d.timeout,
                                             "connections": d.connections, "tls-ca": d.tls_ca,
                                             "tls-certificate": d.tls_certificate,
                                             "tls-key": d.tls_key, "tls-name": d.tls_name})
                continue
            lines += toml_table("disk", {
                "name": d.name, "path": d.rel_path, "size": size_str(d.size), "direct": d.direct,
            })
        for layer in s.layers:
            sizes = {"extent": layer.extent, "metadata-size": layer.metadata_size}
            lines += toml_table("layer", {
                "name": layer.name, "kind": layer.kind, "children": list(layer.children),
                **{key: size_str(n) for key, n in sizes.items() if n is not None},
                "commit-interval-ms": layer.commit_interval_ms,
                **layer.options,
            })
            if layer.volumes:
                vols = ", ".join(f'{{ name = {toml_str(v.name)}, size = "{size_str(v.size)}" }}' for v in layer.volumes)
                lines.append(f"volumes = [{vols}]")
        for e in s.exports:
            lines += toml_table("export", {
                "name": e.name, "device": e.device, "read-only": e.read_only,
                "description": e.description, "allow": e.allow,
            })
        if s.tls is not None:
            lines += ["", "[tls]"] + [f"{k} = {toml_value(v)}" for k, v in s.tls.items() if v is not None]
        return "\n".join(lines) + "\n"

    # ---- lifecycle --------------------------------------------------------
    def start(self) -> "Server":
        assert self.proc is None or self.proc.poll() is not None
        self.stopped = False
        if self.stderr_path.exists():
            self.history.append(self.stderr_path.read_text(errors="replace"))
        if self.kind == "strata":
            self._start_strata()
        elif self.kind == "qemu-nbd":
            self._start_qemu_nbd()
        else:
            raise RuntimeError(f"unknown STRATA_TEST_SERVER={self.kind!r}")
        return self

    def _popen(self, argv: list[str]) -> None:
        self.stdout_f = open(self.stdout_path, "wb")
        self.stderr_f = open(self.stderr_path, "wb")
        # cwd is deliberately NOT the data dir: relative paths in the config
        # must resolve against the config file's folder.
        self.proc = subprocess.Popen(
            argv,
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=self.stdout_f,
            stderr=self.stderr_f,
            env={**os.environ, "RUST_BACKTRACE": "1"},
        )

    def spawn(self) -> None:
        """Start `strata serve` without waiting for it to be ready (see crash())."""
        assert self.kind == "strata"
        assert self.proc is None or self.proc.poll() is not None
        self.stopped = False
        if self.stderr_path.exists():
            self.history.append(self.stderr_path.read_text(errors="replace"))
        if not self.binary.exists():
            pytest.fail(f"strata binary not found at {self.binary} (run cargo build --release or set STRATA_BIN)")
        self.write_config()
        self._popen([str(self.binary), "serve", "--config", str(self.config_path)])

    def crash(self) -> int:
        """SIGKILL the server (if something else has not already) and reap it: no shutdown
        of any kind.  start() then restarts it on the same data.  Returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        rc = self.proc.wait()
        self._close_logs()
        self.stopped = True
        self.proc = None
        return rc

    def _close_logs(self) -> None:
        for name in ("stdout_f", "stderr_f"):
            f = getattr(self, name, None)
            if f:
                f.close()
                setattr(self, name, None)

    def _start_strata(self) -> None:
        if not self.binary.exists():
            pytest.fail(f"strata binary not found at {self.binary} (run cargo build --release or set STRATA_BIN)")
        self.write_config()
        inside = ["ip", "netns", "exec", self.spec.netns] if self.spec.netns else []
        self._popen([*inside, str(self.binary), "serve", "--config", str(self.config_path)])
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            out = self.stdout_path.read_text(errors="replace")
            if any(line.startswith("ready:") for line in out.splitlines()):
                return
            if self.proc.poll() is not None:
                self.stopped = True  # reported here; teardown need not report it again
                pytest.fail(
                    f"strata serve exited with {self.proc.returncode} before printing ready:\n"
                    f"--- stdout ---\n{out}\n--- stderr ---\n{self.stderr_text()}"
                )
            time.sleep(0.02)
        self._kill()
        pytest.fail(f"strata serve did not print ready: within {READY_TIMEOUT}s\n--- stderr ---\n{self.stderr_text()}")

    def _start_qemu_nbd(self) -> None:
        s = self.spec
        if len(s.exports) != 1 or s.metrics or (s.tcp and s.unix):
            pytest.skip("configuration needs strata (qemu-nbd stand-in serves one export on one listener)")
        e = s.exports[0]
        disk = next(d for d in s.disks if d.name == e.device)
        path = self.disk_file(disk.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            with open(path, "wb") as f:
                f.truncate(disk.size)
        argv = ["qemu-nbd", "-f", "raw", "-t", "-e", "128", "-x", e.name, "--discard=unmap",
                "--cache=writeback", "--aio=threads"]
        if s.tcp:
            argv += ["-b", "127.0.0.1", "-p", str(self.tcp_port)]
        else:
            argv += ["-k", self.sock]
        if e.read_only:
            argv.append("-r")
        if e.description:
            argv += ["-D", e.description]
        argv.append(str(path))
        self._popen(argv)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"qemu-nbd exited early: {self.stderr_text()}")
            try:
                if s.tcp:
                    socket.create_connection(("127.0.0.1", self.tcp_port), timeout=1).close()
                else:
                    c = socket.socket(socket.AF_UNIX)
                    c.connect(self.sock)
                    c.close()
                return
            except OSError:
                time.sleep(0.02)
        self._kill()
        pytest.fail("qemu-nbd did not come up")

    def _kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        """Signal the server and wait; returns its exit code (or kills it and fails)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill()
                raise AssertionError(
                    f"server did not exit within {timeout}s of signal {sig}\n--- stderr ---\n{self.stderr_text()}"
                )
        for f in (getattr(self, "stdout_f", None), getattr(self, "stderr_f", None)):
            if f:
                f.close()
        rc = self.proc.returncode
        self.stopped = True
        if self.kind == "qemu-nbd" and rc == -sig:
            rc = 0  # qemu-nbd dies by the signal; only strata promises exit 0
        return rc

    def restart(self) -> "Server":
        rc = self.stop()
        assert rc == 0, f"server exited {rc} on SIGTERM\n{self.stderr_text()}"
        self.proc = None
        return self.start()

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stdout_text(self) -> str:
        try:
            return self.stdout_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ---- clients ----------------------------------------------------------
    def connect(self, export: str | None = None, strict: bool = True, meta: bool = False, tcp: bool = False):
        import nbd

        h = nbd.NBD()
        if not strict:
            h.set_strict_mode(0)
        if meta:
            h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
        h.connect_uri(self.tcp_uri(export) if tcp else self.uri(export))
        return h

    def status(self, *args: str, json_out: bool = True):
        import json

        argv = [str(self.binary), "status", *args]
        if not args:
            argv += ["--data-dir", str(self.data_dir)]
        if json_out:
            argv.append("--json")
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"{argv} exited {r.returncode}\nstdout:{r.stdout}\nstderr:{r.stderr}"
        return json.loads(r.stdout) if json_out else r.stdout


def _short_tmpdir() -> Path:
    # Unix socket paths are limited to 108 bytes: keep the data dir short.
    return Path(tempfile.mkdtemp(prefix="strata-it-", dir="/tmp"))


# `strata sim` runs this sibling executable (crates/sim), kept out of the serving binary.
SIM_BIN = STRATA_BIN.parent / "strata-sim"


def ensure_simulator():
    """`strata sim` needs `strata-sim` next to the strata binary. `cargo build --release -p
    strata` does not build it, so it is built here once when missing (test.sh builds both)."""
    if SIM_BIN.exists():
        return
    if STRATA_BIN.parent != REPO / "target" / "release":
        pytest.fail(f"{SIM_BIN} not found: build it next to $STRATA_BIN")
    subprocess.run(["cargo", "build", "--release", "-p", "strata-sim"], cwd=REPO, check=True, timeout=1800)


def requires_strata():
    return pytest.mark.skipif(SERVER_KIND != "strata", reason="needs the strata server")


def run(argv, timeout=120, check=True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    if check:
        assert r.returncode == 0, f"{argv} exited {r.returncode}\nstdout:\n{r.stdout[-5000:]}\nstderr:\n{r.stderr[-5000:]}"
    return r


def admin_command(srv: "Server", *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`strata ARGS… --data-dir DATA`: a client command against the running server."""
    return run([STRATA_BIN, *args, "--data-dir", srv.data_dir], timeout=120, check=check)


def admin_refused(srv: "Server", *args: str) -> str:
    """Runs a client command that must fail; returns its stderr."""
    r = admin_command(srv, *args, check=False)
    assert r.returncode != 0, f"{args} was accepted: {r.stdout}"
    return r.stderr


def pattern_bytes(seed: int, n: int) -> bytes:
    import random

    return random.Random(seed).randbytes(n)


def close_handle(h) -> None:
    """Disconnect politely if possible; libnbd < 1.16 has no close(), the
    handle is freed when the last reference goes."""
    with contextlib.suppress(Exception):
        h.shutdown()
    if hasattr(h, "close"):
        h.close()


@contextlib.contextmanager
def nbd_handle(srv: Server, **kw):
    h = srv.connect(**kw)
    try:
        yield h
    finally:
        close_handle(h)


def sha256_file(path, length: int | None = None) -> str:
    import hashlib

    hsh = hashlib.sha256()
    left = length
    with open(path, "rb") as f:
        while True:
            n = 4 * MiB if left is None else min(4 * MiB, left)
            if n == 0:
                break
            b = f.read(n)
            if not b:
                break
            hsh.update(b)
            if left is not None:
                left -= len(b)
    return hsh.hexdigest()


ERRNO_RE = re.compile(r"\b(E[A-Z]+)\b")


def assert_alive_and_working(srv: Server, offset: int = 200 * MiB, length: int = 8192) -> None:
    """A fresh connection can write, flush and read back, and the server still runs."""
    data = pattern_bytes(offset, length)
    with nbd_handle(srv) as h:
        h.pwrite(data, offset)
        h.flush()
        assert h.pread(len(data), offset) == data
    assert srv.alive(), "server died"


@contextlib.contextmanager
def block_device(srv: "Server", workdir: Path, tag: str, export: str | None = None, read_only: bool = False):
    """An export (the server's default one unless named) as a block device: nbdfuse exposes
    it as a file, a loop device over it. `tag` names the fuse folder and its log. With
    `read_only` both are attached read-only on purpose (over a read-only export, such as a
    snapshot, losetup would otherwise fall back to read-only by itself)."""
    ro = ["-r"] if read_only else []
    fusedir = workdir / f"fuse-{tag}"
    fusedir.mkdir()
    log_path = workdir / f"nbdfuse-{tag}.log"
    log = open(log_path, "wb")
    fuse = subprocess.Popen(["nbdfuse", *ro, str(fusedir), srv.uri(export)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    loop = None
    try:
        dev = fusedir / "nbd"
        deadline = time.monotonic() + 20
        while not dev.exists():
            assert fuse.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "nbdfuse did not expose the export"
            time.sleep(0.05)
        loop = run(["losetup", "-f", "--show", *ro, dev]).stdout.strip()
        yield loop
    finally:
        if loop:
            subprocess.run(["losetup", "-d", loop], check=False)
        unmount_fuse(fusedir, fuse)
        log.close()


def unmount_fuse(fusedir: Path, fuse: subprocess.Popen) -> None:
    """Unmounts an nbdfuse folder and waits for its nbdfuse to exit (killed after 20 s)."""
    subprocess.run(["fusermount3", "-u", str(fusedir)], check=False)
    try:
        fuse.wait(20)
    except subprocess.TimeoutExpired:
        fuse.kill()
        fuse.wait()


def scrape(url: str, label: str | None = None) -> dict[str, float]:
    """A Prometheus text endpoint: each series (`name{labels}`) to its value. `label` (a
    `name="value"` pair, such as a brick's own) is left out of the keys."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200, reply.status
        text = reply.read().decode()
    series = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        key, value = line.rsplit(" ", 1)
        if label is not None:
            key = key.replace(f"{label},", "").replace(f",{label}", "").replace(f"{{{label}}}", "")
        series[key] = float(value)
    return series


def mount(dev: str, mnt: Path, options: str | None = None) -> None:
    """`dev` mounted as ext4 at `mnt` (made if missing), over a shared bind mount of `mnt`
    itself; `unmount` takes both away.

    Why the bind: a mount namespace made while the file system is mounted (`ip netns exec`,
    run by a test beside this one) holds a copy of every mount. Under a private mount, as a
    container's are, that copy keeps the file system alive after it is unmounted here, and the
    next mount of the device fails with EBUSY ("already mounted or mount point busy": CI,
    2026-12-02). Under a shared mount the namespace's copy is a slave (`ip netns exec` makes it
    one), and goes when it is unmounted here."""
    mnt.mkdir(exist_ok=True)
    run(["mount", "--bind", mnt, mnt])
    try:
        run(["mount", "--make-shared", mnt])
        run(["mount", "-t", "ext4", *(["-o", options] if options else []), dev, mnt])
    except BaseException:
        subprocess.run(["umount", str(mnt)], check=False)
        raise


def unmount(mnt: Path, check: bool = True) -> None:
    """Unmounts what `mount` mounted at `mnt`: the file system, then the bind under it."""
    run(["umount", mnt], check=check)
    run(["umount", mnt], check=check)


@contextlib.contextmanager
def mounted(dev: str, mnt: Path, options: str | None = None):
    """`dev` mounted as ext4 at `mnt` (`mount`) with mount `options` ("ro", …). Unmounted on
    the way out unless the body did it (`unmount`); a failing unmount fails the test, since a
    test that goes on to fsck or detach the device would otherwise check a mounted one."""
    mount(dev, mnt, options)
    try:
        yield mnt
    except BaseException:
        unmount(mnt, check=False)
        raise
    if os.path.ismount(mnt):
        unmount(mnt)


def assert_fsck_clean(dev: str, what: str) -> None:
    """`e2fsck -fn`: a full check that changes nothing; exit 0 means no problem found."""
    r = run(["e2fsck", "-fn", dev], check=False, timeout=180)
    assert r.returncode == 0, f"e2fsck ({what}) exited {r.returncode}:\n{r.stdout}\n{r.stderr}"


def export_sha256(srv: Server, export: str, length: int | None = None) -> str:
    """sha256 of an export's first `length` bytes (all of it by default), read over NBD."""
    import hashlib

    hsh = hashlib.sha256()
    with nbd_handle(srv, export=export) as h:
        end = h.get_size() if length is None else length
        for off in range(0, end, 4 * MiB):
            hsh.update(h.pread(min(4 * MiB, end - off), off))
    return hsh.hexdigest()
