"""`strata sim`: the deterministic simulator from the command line (docs/simulator.md).

The disk models against the papers, the WebSearch trace on a simulated RAID-0 of three
Cheetahs (outputs, determinism), replay on a stack file, a precise error for bad input, and
the point of the simulator: one `[[layer]]` text, written once below, is served over NBD by
`strata serve` on file disks and run by `strata sim run` on simulated Cheetahs, through the
same layer registry and code.
"""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness import MiB, REPO, STRATA_BIN, ensure_simulator, Server, ServerSpec, close_handle, pattern_bytes, requires_strata, run

pytestmark = requires_strata()

SIM = REPO / "sim"
TRACE = REPO.parent / "shared" / "traces" / "websearch-spc.trace"
WEBSEARCH_REQUESTS = 24_783
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason=f"no trace at {TRACE}")


def sim(*args, check=True, timeout=120) -> subprocess.CompletedProcess:
    ensure_simulator()
    return run([STRATA_BIN, "sim", *args], check=check, timeout=timeout, cwd=REPO)


def test_validate_disk_every_row_within_five_percent():
    rows = json.loads(sim("validate-disk", "--json").stdout)
    assert len(rows) >= 20
    for row in rows:
        assert row["within_tolerance"], row
        assert row["low"] <= row["simulated"] <= row["high"], row
        # A figure from the paper: ±5 %. A statement without one ("bound"): its band.
        if row["anchor"] == "value":
            assert 0.95 <= row["ratio"] <= 1.05, row
        else:
            assert row["anchor"] == "bound", row


@needs_trace
def test_websearch_on_raid0_writes_report_plots_and_records(tmp_path):
    out = tmp_path / "out"
    r = sim("run", "sim/websearch-raid0.toml", "--out", out)
    assert "latency (ms)" in r.stdout and f"{WEBSEARCH_REQUESTS} requests simulated" in r.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["throughput"]["ios"] == WEBSEARCH_REQUESTS
    assert report["summary"]["failed"] == 0
    assert [d["name"] for d in report["disks"]] == ["d0", "d1", "d2"]
    for name in ("latency-cdf.svg", "latency-time.svg", "utilization.svg", "queue-depth.svg"):
        root = ET.parse(out / name).getroot()
        assert root.tag.endswith("svg"), name
    lines = (out / "records.csv").read_text().splitlines()
    assert len(lines) == WEBSEARCH_REQUESTS + 1  # a header and one row per request

    again = tmp_path / "again"
    sim("run", "sim/websearch-raid0.toml", "--out", again)
    assert (again / "report.json").read_bytes() == (out / "report.json").read_bytes()

    other = tmp_path / "seed2"
    sim("run", "sim/websearch-raid0.toml", "--out", other, "--seed", "2")
    assert (other / "report.json").read_bytes() != (out / "report.json").read_bytes()
    assert json.loads((other / "report.json").read_text())["seed"] == 2


@needs_trace
def test_replay_on_a_stack_file():
    r = sim("replay", "--trace", TRACE, "--stack", "sim/raid0-3-cheetah.toml", "--speedup", "4", "--json")
    report = json.loads(r.stdout)
    assert report["summary"]["throughput"]["ios"] == WEBSEARCH_REQUESTS
    assert report["top"] == "r0"
    # Four times the arrival rate on the same disks: the trace takes about a quarter of the time.
    plain = json.loads(sim("replay", "--trace", TRACE, "--stack", "sim/raid0-3-cheetah.toml", "--json").stdout)
    assert report["simulated_ns"] < plain["simulated_ns"] / 3


def test_a_stack_with_an_unknown_model_fails_with_its_name(tmp_path):
    stack = tmp_path / "stack.toml"
    stack.write_text('[[disk]]\nname = "d0"\nmodel = "quantum-fireball"\n')
    r = sim("replay", "--trace", TRACE, "--stack", stack, check=False)
    assert r.returncode != 0
    assert 'disk d0: unknown model "quantum-fireball"' in r.stderr, r.stderr
    assert "cheetah-15k5-300g" in r.stderr, r.stderr


# ---- the same layer code under `strata serve` and in the simulator ------------------------

DISKS = ["d0", "d1", "d2"]

# Written once; both the serve config and the sim stack below embed this very text.
LAYERS = {
    kind: f"""
[[layer]]
name = "top"
kind = "{kind}"
children = ["d0", "d1", "d2"]
chunk = "64KiB"
"""
    for kind in ("stripe", "raid5")
}


def serve_config(layer_text: str, disks=DISKS, device="top") -> str:
    disks = "".join(f'\n[[disk]]\nname = "{d}"\npath = "disks/{d}.img"\nsize = "64MiB"\n' for d in disks)
    return (
        'data-dir = "."\nlisten = ["unix:nbd.sock"]\nadmin = "admin.sock"\n'
        + disks
        + layer_text
        + f'\n[[export]]\nname = "vol"\ndevice = "{device}"\n'
    )


def sim_experiment(layer_text: str, disks=DISKS) -> str:
    disks = "".join(f'\n[[disk]]\nname = "{d}"\nmodel = "cheetah-15k5-300g"\n' for d in disks)
    return (
        'name = "same layers as serve"\nseed = 5\nqueue-depth = 8\ndata = "stored"\n'
        + disks
        + layer_text
        + '\n[workload]\nkind = "uniform"\nread_share = 0.5\ncount = 3000\n'
        + 'sizes = [{ bytes = 4096, weight = 3 }, { bytes = 65536, weight = 1 }]\n'
    )


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_the_same_layer_text_serves_nbd_and_runs_in_the_simulator(kind, workdir):
    layer_text = LAYERS[kind]

    # Under `strata serve`, on file disks, through NBD.
    srv = Server(workdir / "serve", ServerSpec(disks=[], exports=[]))
    srv.config_path.write_text(serve_config(layer_text))
    srv.keep_config = True  # serve the text above, not one generated from the spec
    srv.start()
    try:
        h = srv.connect(export="vol")
        try:
            size = h.get_size()
            data_disks = len(DISKS) - (1 if kind == "raid5" else 0)
            # The members' capacity less the layer's own labels and metadata.
            assert 0.9 * data_disks * 64 * MiB < size <= data_disks * 64 * MiB
            payload = pattern_bytes(6, 3 * 64 * 1024 + 4096)  # crosses every member
            for offset in (0, 5 * 64 * 1024 + 512, size - len(payload)):
                h.pwrite(payload, offset)
                h.flush()
                assert h.pread(len(payload), offset) == payload, f"read back at {offset}"
        finally:
            close_handle(h)
    finally:
        assert srv.stop() == 0, srv.stderr_text()

    # In the simulator, on simulated Cheetah 15K.5 drives, reads verified against writes.
    experiment = workdir / "sim.toml"
    experiment.write_text(sim_experiment(layer_text))
    report = json.loads(sim("run", experiment, "--json").stdout)
    assert report["top"] == "top"
    assert report["summary"]["throughput"]["ios"] == 3000
    assert report["summary"]["failed"] == 0
    assert report["read_mismatches"] == 0
    # Every member did work: the stripe (or raid5) spread the load, as it does under serve.
    for disk in report["disks"]:
        assert disk["stats"]["reads"] + disk["stats"]["writes"] > 300, disk


# A thin pool over a raid5 over four disks (sim/thin-raid5-4-cheetah.toml's [[layer]] text):
# the pool is built by the same library code under `strata serve` and in the simulator, and
# its volume is the device both run against.
THIN_OVER_RAID5 = "\n[[layer]]\n" + (SIM / "thin-raid5-4-cheetah.toml").read_text().split("\n[[layer]]\n", 1)[1]


def test_a_thin_pool_over_a_raid5_serves_nbd_and_runs_in_the_simulator(workdir):
    disks = ["d0", "d1", "d2", "d3"]
    srv = Server(workdir / "serve", ServerSpec(disks=[], exports=[]))
    srv.config_path.write_text(serve_config(THIN_OVER_RAID5, disks=disks, device="pool/vol"))
    srv.keep_config = True
    srv.start()
    try:
        h = srv.connect(export="vol")
        try:
            assert h.get_size() == 128 * MiB
            payload = pattern_bytes(8, 3 * 64 * 1024 + 4096)  # crosses extents and chunks
            for offset in (0, 5 * 64 * 1024 + 512, 128 * MiB - len(payload)):
                h.pwrite(payload, offset)
                h.flush()
                assert h.pread(len(payload), offset) == payload, f"read back at {offset}"
            # Never written: a thin volume reads zeroes there.
            assert h.pread(4096, 64 * MiB) == bytes(4096)
        finally:
            close_handle(h)
    finally:
        assert srv.stop() == 0, srv.stderr_text()

    experiment = workdir / "sim.toml"
    experiment.write_text(sim_experiment(THIN_OVER_RAID5, disks=disks))
    report = json.loads(sim("run", experiment, "--json", timeout=300).stdout)
    assert report["top"] == "pool/vol"
    assert report["summary"]["throughput"]["ios"] == 3000
    assert report["summary"]["failed"] == 0
    assert report["read_mismatches"] == 0
    for disk in report["disks"]:
        assert disk["stats"]["reads"] + disk["stats"]["writes"] > 300, disk


# ---- Clotho §3.4 on the thin pool's versions (docs/versions-sim.md) ------------------------


def test_clotho_reports_the_three_parts_and_is_deterministic():
    # 1/64 of the paper's sizes: seconds of wall time. The shape itself is asserted at larger
    # scales by crates/sim/tests/clotho.rs; this checks the command and its JSON.
    args = ["clotho", "--scale", "64", "--json"]
    first = sim(*args).stdout
    report = json.loads(first)
    assert report["config"]["scale"] == 64 and report["config"]["seed"] == 1
    reads = {(r["layout"], r["versions"] > 0): r for r in report["reads"]}
    assert set(reads) == {("disk", False), ("remap", False), ("remap", True)}
    for run in reads.values():
        assert run["reads"]["failed"] == 0
        assert run["reads"]["disk_reads_per_io"] == 1.0, run  # chains are walked in memory
    assert reads[("disk", False)]["overhead_percent"] == 0.0
    writes = {(w["layout"], w["period_ns"]): w for w in report["writes"]}
    periods = report["config"]["version_periods"]
    expected = {("disk", None), ("remap", None), ("copy", min(periods))}
    assert set(writes) == expected | {("remap", p) for p in periods}
    assert writes[("remap", None)]["versions_taken"] == 0
    assert writes[("remap", min(periods))]["versions_taken"] == 7
    compacted = {(c["superseded_share"], c["compacted"]): c for c in report["compacted"]}
    assert set(compacted) == {(0.0, True), (0.5, True), (1.0, True), (1.0, False)}
    for run in compacted.values():
        assert run["reads"]["ios"] == 2000 and run["reads"]["failed"] == 0, run
        assert run["verified_blocks"] > 0, run
    assert compacted[(0.0, True)]["reads"]["disk_reads_per_io"] == 1.0
    assert compacted[(1.0, True)]["extents_compacted"] == compacted[(1.0, True)]["extents"]
    assert compacted[(1.0, True)]["reads"]["disk_reads_per_io"] == 2.0  # delta + base extent
    assert compacted[(1.0, False)]["reads"]["disk_reads_per_io"] == 1.0
    assert sim(*args).stdout == first  # the same seed, byte for byte
    assert sim("clotho", "--scale", "64", "--json", "--seed", "2").stdout != first

    table = sim("clotho", "--scale", "64", "--part", "c").stdout
    assert "(c) random 4 KiB reads of a compacted version" in table
    assert "100 % superseded, compacted" in table
    assert "(a)" not in table and "(b)" not in table

    refused = sim("clotho", "--part", "z", check=False)
    assert refused.returncode != 0 and "--part" in refused.stderr, refused.stderr


# ---- ALV §5 on the raid5 grow engine (docs/raid5-grow-sim.md) ---------------------------


@needs_trace
def test_alv_grows_with_both_policies_and_alv_writes_less_metadata(tmp_path):
    # 1/256 of the paper's 30 GiB members: seconds of virtual time per grow. The shape of the
    # results at larger scales is in the doc; this checks the command, its table and JSON.
    args = ["alv", "--scale", "256", "--load", "websearch,offline"]
    report = json.loads(sim(*args, "--json", timeout=600).stdout)
    assert report["config"]["scale"] == 256 and report["config"]["model"] == "fc-10k-146g"
    runs = {(r["setup"]["load"], r["setup"]["policy"]): r for r in report["runs"]}
    assert set(runs) == {(load, policy) for load in ("websearch", "offline") for policy in ("alv", "md")}
    for run in runs.values():
        assert run["finished"], run["setup"]
        assert run["grow_ns"] > 0 and run["metadata_writes"] >= 1
        assert run["mover_bytes_written"] >= run["total_bytes"]
    for load in ("websearch", "offline"):
        assert runs[(load, "alv")]["metadata_writes"] < runs[(load, "md")]["metadata_writes"]
    # Response times only under a load, from the requests that arrived during the grow.
    assert runs[("offline", "alv")]["user"] is None
    assert runs[("websearch", "md")]["user"]["count"] > 100
    assert report["baselines"][0]["load"] == "websearch"

    out = tmp_path / "alv"
    text = sim(*args, "--out", out, timeout=600).stdout
    for heading in ("load alone (no grow)", "grow ALV/MD", "targets (issue 15)", "WebSearch (SPC trace)", "none (offline)"):
        assert heading in text, text
    ET.parse(out / "response-websearch.svg")
    assert json.loads((out / "report.json").read_text()) == report  # the same seed, the same run

    refused = sim("alv", "--load", "tpc-c", check=False)
    assert refused.returncode != 0 and "--load" in refused.stderr, refused.stderr


def test_proximal_reproduces_the_tables_at_a_tiny_scale(tmp_path):
    # Members of 64 MiB (13 extents of 16 MiB at 89 %), 300 updates per extent: seconds of
    # wall time. The numbers at the default scale are in docs/proximal-sim.md; this checks the
    # command, its tables, its JSON and its plots.
    args = ["proximal", "--member-mib", "64", "--staging", "1,4", "--updates", "300",
            "--trigger-updates", "100", "--no-quirk"]
    out = tmp_path / "proximal"
    text = sim(*args, "--out", out, timeout=300).stdout
    for heading in ("Table 2", "Table 3", "Update in place", "Triggers", "write-anywhere"):
        assert heading in text, text
    report = json.loads((out / "report.json").read_text())
    assert [r["setup"]["percent"] for r in report["table2"]] == [1.0, 4.0]
    small, big = report["table2"]
    assert big["updates_per_batch"] > small["updates_per_batch"]
    assert big["amplification"] < small["amplification"]
    assert abs(report["in_place"]["ios_per_update"] - 4.0) < 0.05, report["in_place"]
    assert [r["setup"]["trigger"] for r in report["triggers"]][0] == "full"
    for name in ("ios-per-revolution.svg", "triggers.svg"):
        ET.parse(out / name)

    refused = sim("proximal", "--member-mib", "8", check=False)
    assert refused.returncode != 0 and "--member-mib" in refused.stderr, refused.stderr
