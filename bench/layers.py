#!/usr/bin/python3
"""Layer scaling benchmark (issue 4's targets), side by side in one run.

This machine's disk files all share one SSD, so independent disks are emulated: every member
is a file disk under a `delay` layer with the same bandwidth limit (BENCH_MEMBER_BW, default
100MiB per second). One limited member is the baseline; the stripe and the raid5 are built of
members limited the same way. Rows:

- 1 MiB sequential reads, QD8: one member vs `stripe` over 3 members (target >= 2.7x).
- Aligned full-stripe writes (3 x chunk = 192 KiB, QD8): one member vs `raid5` over 4 members
  (target >= 2.7x).
- 4 KiB random writes to `raid5`: member I/Os per client write, counted from the members'
  own counters in `strata status --json` (target <= 4).

Each raid5 row runs twice: `raid5` keeps its stripe journals on its members (the default),
`raid5+jd` keeps them on a journal device (`journal-device`, a file limited to
BENCH_JOURNAL_BW, default 4x a member: a small flash device next to disks). Journal-device
I/Os are counted apart from member I/Os.

Run: bench/layers.sh (BENCH_SECONDS per job, default 10; BENCH_ROUNDS rounds, default 3,
median reported). With STRATA_BASE_BIN set to an older binary, both binaries serve the same
stack from their own folders, each round measures both in turn, and a last table gives every
figure of this build against the baseline.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATA = Path(os.environ.get("STRATA_BIN", ROOT / "target/release/strata"))
# An older strata binary to measure in the same run (before/after a change), or none.
BASE = Path(os.environ["STRATA_BASE_BIN"]) if os.environ.get("STRATA_BASE_BIN") else None
SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
MEMBER_BW = os.environ.get("BENCH_MEMBER_BW", "100MiB")
JOURNAL_BW = os.environ.get("BENCH_JOURNAL_BW", "400MiB")
DIRECT = os.environ.get("BENCH_DIRECT", "1") == "1"
CHUNK = 64 * 1024


def config(base: Path) -> str:
    lines = ['listen = ["unix:nbd.sock"]', 'admin = "admin.sock"']
    disks = ["one"] + [f"s{i}" for i in range(3)] + [f"r{i}" for i in range(4)] + [f"q{i}" for i in range(4)]
    for d in disks:
        lines += ["[[disk]]", f'name = "{d}"', f'path = "{d}.img"', 'size = "2GiB"', f"direct = {str(DIRECT).lower()}"]
        lines += ["[[layer]]", f'name = "lim-{d}"', 'kind = "delay"', f'children = ["{d}"]', f'bandwidth = "{MEMBER_BW}"']
    lines += ["[[disk]]", 'name = "qj"', 'path = "qj.img"', 'size = "64MiB"', f"direct = {str(DIRECT).lower()}"]
    lines += ["[[layer]]", 'name = "lim-qj"', 'kind = "delay"', 'children = ["qj"]', f'bandwidth = "{JOURNAL_BW}"']
    lines += ["[[layer]]", 'name = "stripe"', 'kind = "stripe"', 'children = ["lim-s0", "lim-s1", "lim-s2"]',
              f'chunk = "{CHUNK}"']
    lines += ["[[layer]]", 'name = "raid5"', 'kind = "raid5"',
              'children = ["lim-r0", "lim-r1", "lim-r2", "lim-r3"]', f'chunk = "{CHUNK}"']
    lines += ["[[layer]]", 'name = "raid5j"', 'kind = "raid5"',
              'children = ["lim-q0", "lim-q1", "lim-q2", "lim-q3", "lim-qj"]', f'chunk = "{CHUNK}"',
              'journal-device = "lim-qj"']
    for name, device in [("one", "lim-one"), ("stripe", "stripe"), ("raid5", "raid5"), ("raid5j", "raid5j")]:
        lines += ["[[export]]", f'name = "{name}"', f'device = "{device}"']
    return "\n".join(lines) + "\n"


def fio(sock: Path, export: str, rw: str, bs: int, qd: int, seconds: int, size: str = "1536M",
        ramp: bool = True) -> dict:
    argv = ["fio", "--name=bench", "--ioengine=nbd", f"--uri=nbd+unix:///{export}?socket={sock}", f"--rw={rw}",
            f"--bs={bs}", f"--iodepth={qd}", f"--size={size}", "--time_based", f"--runtime={seconds}",
            "--output-format=json"] + (["--ramp_time=1"] if ramp else [])
    proc = subprocess.run(argv, capture_output=True, text=True)
    out = proc.stdout
    if proc.returncode != 0 or "{" not in out:
        raise RuntimeError(f"fio {export} {rw} failed: {proc.stderr[-2000:]}{out[-2000:]}")
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read"] if "read" in rw else job["write"]
    return {"mib_s": side["bw_bytes"] / 2**20, "iops": side["iops"], "ios": side["total_ios"]}


def status(strata: Path, data: Path) -> dict:
    out = subprocess.run([str(strata), "status", "--json", "--data-dir", str(data)], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def file_ios(strata: Path, data: Path, device: str) -> dict[str, int]:
    """Reads + writes done by each file under `device`, by file name (journal and metadata
    included)."""
    def walk(node):
        yield node
        for child in node.get("children", []):
            yield from walk(child)
    top = next(d for d in status(strata, data)["devices"] if d["name"] == device)
    out = {}
    for node in walk(top):
        if node["kind"] == "file" and node.get("stats"):
            name = Path(node["name"]).stem
            out[name] = sum(node["stats"].get(op, {}).get("ops", 0) for op in ("read", "write"))
    return out


def member_ios(strata: Path, data: Path, device: str) -> tuple[int, int]:
    """(member I/Os, journal-device I/Os) so far of a raid5."""
    ios = file_ios(strata, data, device)
    journal = sum(v for k, v in ios.items() if k == "qj")
    return sum(ios.values()) - journal, journal


class Server:
    """One strata binary serving the benchmark's stack from a folder of its own."""

    def __init__(self, label: str, strata: Path):
        self.label, self.strata = label, strata
        self.work = Path(tempfile.mkdtemp(prefix="strata-layers-bench."))
        (self.work / "strata.toml").write_text(config(self.work))
        self.log = open(self.work / "server.log", "w")
        self.proc = subprocess.Popen([str(strata), "serve", "--config", str(self.work / "strata.toml")],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        for line in self.proc.stdout:
            if line.startswith("ready:"):
                break
        else:
            raise RuntimeError(f"{label}: server exited; see {self.work / 'server.log'}")
        self.sock = self.work / "nbd.sock"
        self.rows: dict[str, list[float]] = {}

    def add(self, key: str, value: float):
        self.rows.setdefault(key, []).append(value)

    def precondition(self):
        # Write every region a job will touch once before measuring. Reads then return data,
        # not holes; and writes land in file blocks already allocated and written, as on a
        # disk: a first write into a fresh (or fallocate-zeroed) ext4 extent converts it, and a
        # FUA write to the same file (raid5's journal) then waits for the filesystem journal to
        # commit those conversions. That cost belongs to the emulation, not to the layers
        # (round 1 measured 0.9x of round 3 without this).
        for export, size in (("one", "1536M"), ("stripe", "256M"), ("raid5", "1536M"), ("raid5j", "1536M")):
            subprocess.run(["fio", "--name=fill", "--ioengine=nbd",
                            f"--uri=nbd+unix:///{export}?socket={self.sock}", "--rw=write", "--bs=1M",
                            "--iodepth=8", f"--size={size}"], capture_output=True, check=True)

    def round(self):
        sock = self.sock
        self.add("read one", fio(sock, "one", "read", 1 << 20, 8, SECONDS, "256M")["mib_s"])
        self.add("read stripe", fio(sock, "stripe", "read", 1 << 20, 8, SECONDS, "256M")["mib_s"])
        self.add("write one", fio(sock, "one", "write", 3 * CHUNK, 8, SECONDS)["mib_s"])
        for export in ("raid5", "raid5j"):
            self.add(f"write {export}", fio(sock, export, "write", 3 * CHUNK, 8, SECONDS)["mib_s"])
            before = member_ios(self.strata, self.work, export)
            # No ramp: the member counters see every write, so fio must count every write.
            small = fio(sock, export, "randwrite", 4096, 8, max(3, SECONDS // 2), ramp=False)
            after = member_ios(self.strata, self.work, export)
            writes = max(1, small["ios"])
            self.add(f"member ios per 4k write {export}", (after[0] - before[0]) / writes)
            self.add(f"journal ios per 4k write {export}", (after[1] - before[1]) / writes)
            self.add(f"{export} 4k randwrite iops", small["iops"])

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.rows.items()}

    def close(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()
        # The member files are sparse but grow to gigabytes over a run.
        import shutil
        shutil.rmtree(self.work, ignore_errors=True)


def table(med: dict[str, float]):
    print("| workload | one member | layer | ratio | target |")
    print("|---|---:|---:|---:|---|")
    print(f"| 1 MiB sequential read, QD8: stripe over 3 | {med['read one']:.0f} MiB/s | "
          f"{med['read stripe']:.0f} MiB/s | **{med['read stripe'] / med['read one']:.2f}x** | >= 2.7x |")
    for export, label in (("raid5", "raid5 over 4"), ("raid5j", "raid5 over 4 + journal device")):
        print(f"| 192 KiB full-stripe write, QD8: {label} | {med['write one']:.0f} MiB/s | "
              f"{med['write ' + export]:.0f} MiB/s | **{med['write ' + export] / med['write one']:.2f}x** "
              f"| >= 2.7x |")
    for export, label in (("raid5", "raid5 over 4"), ("raid5j", "raid5 over 4 + journal device")):
        journal = med[f"journal ios per 4k write {export}"]
        extra = f" (+ {journal:.2f} on the journal device)" if export == "raid5j" else ""
        print(f"| 4 KiB random write, QD8: {label}, member I/Os per write | | "
              f"{med[export + ' 4k randwrite iops']:.0f} IOPS | **{med['member ios per 4k write ' + export]:.2f}**"
              f"{extra} | <= 4 |")


def comparison(new: dict[str, float], base: dict[str, float]):
    """Each measured figure of this binary against the baseline binary's, same rounds."""
    rows = [("1 MiB sequential read, one member (MiB/s)", "read one"),
            ("1 MiB sequential read, stripe over 3 (MiB/s)", "read stripe"),
            ("192 KiB write, one member (MiB/s)", "write one"),
            ("192 KiB full-stripe write, raid5 over 4 (MiB/s)", "write raid5"),
            ("192 KiB full-stripe write, raid5 + journal device (MiB/s)", "write raid5j"),
            ("4 KiB random write, raid5 over 4 (IOPS)", "raid5 4k randwrite iops"),
            ("4 KiB random write, raid5 + journal device (IOPS)", "raid5j 4k randwrite iops"),
            ("member I/Os per 4 KiB write, raid5 over 4", "member ios per 4k write raid5")]
    print("| figure | baseline | this build | this / baseline |")
    print("|---|---:|---:|---:|")
    for label, key in rows:
        print(f"| {label} | {base[key]:.2f} | {new[key]:.2f} | **{new[key] / base[key]:.2f}x** |")


def main() -> int:
    servers = [("this build", STRATA)]
    if BASE:
        servers.append(("baseline", BASE))
    running: list[Server] = []
    try:
        for label, strata in servers:
            running.append(Server(label, strata))
        for server in running:
            server.precondition()
        for round_ in range(ROUNDS):
            # Each round measures every binary in turn, so drift in this shared machine's speed
            # hits them alike.
            for server in running:
                print(f"round {round_ + 1}/{ROUNDS}: {server.label}", file=sys.stderr)
                server.round()
        print(f"\nMembers: file disks each limited by `delay` to {MEMBER_BW}/s; chunk 64 KiB; "
              f"{ROUNDS} rounds x {SECONDS} s, medians.\n")
        for server in running:
            if len(running) > 1:
                print(f"\n{server.label} ({server.strata}):\n")
            table(server.medians())
        if len(running) > 1:
            print(f"\nThis build ({STRATA}) against the baseline ({BASE}):\n")
            comparison(running[0].medians(), running[1].medians())
        return 0
    finally:
        for server in running:
            server.close()


if __name__ == "__main__":
    sys.exit(main())
