#!/usr/bin/python3
"""Bricks cost no more than the protocol (issue 17): Strata's NBD client against fio's own nbd
engine (libnbd), both reading from the same `strata serve` brick, in plaintext and over TLS.

The brick: one `strata serve` with a 2 GiB file disk on tmpfs (/dev/shm, so the disk is not
what is measured), exported as `vol` on 127.0.0.1 with `[tls] mode = "on"` (plaintext and
TLS clients on the same server, certificates from certtool). Prefilled with 1 MiB writes.

Rows: 4 KiB random reads at queue depth 32, 4 KiB random writes at QD32, 1 MiB sequential
reads at QD8. For each row, each round runs in turn: fio (ioengine=nbd, one job, one
connection) and `client_bench` (crates/nbd/examples: the client alone, one connection, the
same depth), each in plaintext and with TLS. Medians of BENCH_ROUNDS (default 3) runs of
BENCH_SECONDS (default 10).

Targets: client >= 0.9x fio (plaintext, 4 KiB random QD32 and 1 MiB sequential); TLS costs
<= 15 % of 4 KiB random QD32 throughput against plaintext on the same server.

Run: bench/remote.sh.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATA = Path(os.environ.get("STRATA_BIN", ROOT / "target/release/strata"))
CLIENT = ROOT / "target/release/examples/client_bench"
SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SIZE_GIB = 2
sys.path.insert(0, str(ROOT / "tests/integration"))
from tlscerts import make_pki  # noqa: E402

ROWS = [
    ("4KiB random read, QD32", "randread", 4096, 32),
    ("4KiB random write, QD32", "randwrite", 4096, 32),
    ("1MiB sequential read, QD8", "read", 1 << 20, 8),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_brick(workdir: Path, pki) -> tuple[subprocess.Popen, int]:
    port = free_port()
    data = workdir / "data"
    data.mkdir()
    (data / "strata.toml").write_text(f"""data-dir = "."
listen = ["tcp:127.0.0.1:{port}"]
admin = "admin.sock"

[[disk]]
name = "d0"
path = "d0.img"
size = "{SIZE_GIB}GiB"

[[export]]
name = "vol"
device = "d0"

[tls]
mode = "on"
certificate = "{pki.server_cert}"
key = "{pki.server_key}"
""")
    out = open(workdir / "brick.out", "wb")
    err = open(workdir / "brick.err", "wb")
    proc = subprocess.Popen([str(STRATA), "serve", "--config", str(data / "strata.toml")],
                            stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while b"ready:" not in (workdir / "brick.out").read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the brick did not start:\n{(workdir / 'brick.err').read_text()}")
        time.sleep(0.05)
    return proc, port


def fio(uri: str, rw: str, bs: int, depth: int, seconds: int, workdir: Path,
        home: Path | None = None) -> float:
    """Bytes per second fio's nbd engine moved. With `home`, libnbd finds its TLS files in
    `home/.pki/libnbd` (fio's engine refuses `tls-certificates=` in URIs)."""
    job = workdir / "job.fio"
    job.write_text(f"[global]\nioengine=nbd\nuri={uri}\nrw={rw}\nbs={bs}\niodepth={depth}\n"
                   f"size={SIZE_GIB}g\nruntime={seconds}\ntime_based=1\n[j]\n")
    env = {**os.environ, "HOME": str(home)} if home is not None else None
    r = subprocess.run(["fio", "--output-format=json", str(job)], capture_output=True, text=True,
                       timeout=seconds + 120, check=True, env=env)
    jobs = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    side = jobs["write"] if "write" in rw else jobs["read"]
    assert jobs["error"] == 0, jobs
    return side["io_bytes"] / (side["runtime"] / 1000)


def client(uri: str, rw: str, bs: int, depth: int, seconds: int, ca: Path | None) -> float:
    argv = [str(CLIENT), uri, rw, str(bs), str(depth), str(seconds)]
    if ca is not None:
        argv.append(str(ca))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, check=True)
    result = json.loads(r.stdout)
    return result["bytes"] / result["seconds"]


def main() -> None:
    for tool in ("fio", "certtool"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is needed")
    workdir = Path(tempfile.mkdtemp(prefix="strata-bench-remote-", dir="/dev/shm"))
    try:
        pki = make_pki(workdir / "pki")
        creds = pki.client("bench", "bench.strata.test")
        brick, port = start_brick(workdir, pki)
        plain = f"nbd://127.0.0.1:{port}/vol"
        # libnbd checks the name in the certificate against the URI's host.
        home = workdir / "home"
        shutil.copytree(creds, home / ".pki" / "libnbd")
        tls_uri = f"nbds://localhost:{port}/vol"
        try:
            prefill = workdir / "prefill.fio"
            prefill.write_text(f"[p]\nioengine=nbd\nuri={plain}\nrw=write\nbs=1m\niodepth=8\n"
                               f"size={SIZE_GIB}g\n")
            subprocess.run(["fio", str(prefill)], check=True, capture_output=True, timeout=600)
            results: dict[tuple[str, str], list[float]] = {}
            for _ in range(ROUNDS):
                for name, rw, bs, depth in ROWS:
                    runs = [
                        ("fio", lambda: fio(plain, rw, bs, depth, SECONDS, workdir)),
                        ("strata", lambda: client(plain, rw, bs, depth, SECONDS, None)),
                        ("fio+tls", lambda: fio(tls_uri, rw, bs, depth, SECONDS, workdir, home)),
                        ("strata+tls", lambda: client(tls_uri, rw, bs, depth, SECONDS,
                                                      pki.ca.cert)),
                    ]
                    for who, run in runs:
                        results.setdefault((name, who), []).append(run())
        finally:
            brick.terminate()
            brick.wait(timeout=30)
        report(results)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def report(results: dict[tuple[str, str], list[float]]) -> None:
    def med(name: str, who: str) -> float:
        return statistics.median(results[(name, who)])

    print(f"\nStrata's NBD client vs fio's nbd engine, same `strata serve` brick on 127.0.0.1 "
          f"(median of {ROUNDS} x {SECONDS} s; MiB/s)\n")
    print("| workload | fio | strata client | client/fio | fio TLS | client TLS | client/fio TLS "
          "| TLS cost fio | TLS cost client |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, _, _, _ in ROWS:
        f, s, ft, st = (med(name, w) / 2**20 for w in ("fio", "strata", "fio+tls", "strata+tls"))
        print(f"| {name} | {f:.0f} | {s:.0f} | {s / f:.2f}x | {ft:.0f} | {st:.0f} | {st / ft:.2f}x "
              f"| {100 * (1 - ft / f):.1f}% | {100 * (1 - st / s):.1f}% |")


if __name__ == "__main__":
    main()
