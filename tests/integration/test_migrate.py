"""The `migrate` layer in real mode (docs/layers/migrate.md): a local disk and two bricks, each
a `strata serve` on a host of its own (a network namespace, netns.py) behind the migration
paper's 9 ms round trip (`delay`, `rtt = "9ms"`). fio writes and verifies through it while
migration is forced (δ = 0, tokens plenty, every chunk a candidate) and while one brick is
killed and restarted: every block verifies, no request fails, status shows the data moving."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

from harness import MiB, Disk, Export, Layer, ServerSpec, run
from netns import hosts
from test_hierarchy import layer_node
from test_nbd_tools import fio_job


def migrate_spec(bricks, **options) -> ServerSpec:
    disks = [Disk("local", 128 * MiB)]
    layers = []
    for i, brick in enumerate(bricks, start=1):
        disks.append(Disk(f"b{i}", 128 * MiB, uri=brick.tcp_uri(), timeout="20s"))
        layers.append(Layer(name=f"n{i}", kind="delay", children=[f"b{i}"],
                            options={"rtt": "9ms", "seed": i}))
    settings = {"allocation": "str", "policy": "mig", "delta": "0", "tokens": 1000,
                "token-cap": 1000, "candidate-probability": 1.0, **options}
    layers.append(Layer(name="mig", kind="migrate",
                        children=["local"] + [f"n{i}" for i in range(1, len(bricks) + 1)],
                        options=settings))
    return ServerSpec(disks=disks, layers=layers, exports=[Export("vol", "mig")])


def detail(srv) -> dict:
    return dict(layer_node(srv, "mig")["detail"])


def metrics(srv) -> dict[str, list[tuple[str, float]]]:
    """The server's Prometheus samples of migrate layers: name -> [(labels, value)]."""
    url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read().decode()
    out: dict[str, list[tuple[str, float]]] = {}
    for line in body.splitlines():
        if line.startswith("strata_migrate_"):
            series, value = line.rsplit(None, 1)
            name, _, labels = series.partition("{")
            out.setdefault(name, []).append((labels.rstrip("}"), float(value)))
    return out


def fio_ok(job, workdir, timeout=600) -> dict:
    r = run(["fio", "--output-format=json", str(job)], timeout=timeout, cwd=workdir, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout[r.stdout.index("{"):])
    (j,) = result["jobs"]
    assert j["error"] == 0, j
    return j


def test_forced_migration_and_a_brick_restart_lose_no_verified_block(server_factory, workdir):
    with hosts(2) as places:
        bricks = [server_factory(ServerSpec(tcp=True, unix=False, netns=ns, host=address))
                  for ns, address in places]
        spec = migrate_spec(bricks)
        spec.metrics = True
        front = server_factory(spec)
        # Writes with verification headers, spread over the three children by STR, moved
        # toward the fastest child as they land (δ = 0).
        write = fio_job(workdir / "write.fio", front, "data", rw="randwrite", bs="16k",
                        iodepth=16, size="48m", verify="crc32c", do_verify=1, verify_fatal=1,
                        verify_dump=0)
        fio_ok(write, workdir)
        run(["qemu-io", "-f", "raw", "-c", "flush", front.uri()])
        moved = int(detail(front)["migrations"])
        assert moved > 0, detail(front)
        on_brick2 = int(detail(front)["child 2 blocks"])
        assert on_brick2 > 0, "nothing on brick 2: its restart below would test nothing"
        # Verify everything again while brick 2 is killed outright and comes back: its reads
        # are resent on the new connection within their timeout; migrations go on.
        check = fio_job(workdir / "check.fio", front, "data", rw="randwrite", bs="16k",
                        iodepth=16, size="48m", verify="crc32c", verify_only=1, verify_fatal=1,
                        verify_dump=0)
        verifying = subprocess.Popen(["fio", "--output-format=json", str(check)], cwd=workdir,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        bricks[1].crash()
        time.sleep(0.5)
        bricks[1].start()
        out, err = verifying.communicate(timeout=600)
        assert verifying.returncode == 0, out[-3000:] + err[-3000:]
        (j,) = json.loads(out[out.index("{"):])["jobs"]
        assert j["error"] == 0 and j["read"]["io_bytes"] >= 48 * MiB, j
        assert int(detail(front)["migrations"]) > moved, "reads migrated nothing"
        assert int(detail(front)["child 2 blocks"]) < on_brick2, "reads moved nothing off brick 2"
        log = front.stderr_text()
        assert "reconnected" in log, log[-3000:]
        # The chunks are where the map says: a last full verify, then a clean stop.
        fio_ok(check, workdir)
        stats = detail(front)
        for i in range(3):
            assert "ms ±" in stats[f"child {i} response"], stats
        # Prometheus says the same as status: every migration counted once by its pair and
        # once by its destination; a response time for each child.
        time.sleep(1)  # the last read migrations finish in the background
        stats = detail(front)
        scraped = metrics(front)
        total = int(stats["migrations"])
        assert scraped["strata_migrate_migrations_total"] == [('migrate="mig"', total)], scraped
        between = scraped["strata_migrate_migrations_between_total"]
        assert len(between) == 6 and sum(v for _, v in between) == total, between
        for src in range(3):
            for dst in range(3):
                if src != dst:
                    key = f"migrations child {src} to child {dst}"
                    labels = f'migrate="mig",from="{src}",to="{dst}"'
                    assert (labels, float(stats[key])) in between, (key, between)
        assert sum(v for _, v in scraped["strata_migrate_migrations_to_total"]) == total
        responses = scraped["strata_migrate_response_seconds"]
        assert len(responses) == 3 and all(v > 0 for _, v in responses), responses
        assert front.stop() == 0
        for brick in bricks:
            assert brick.stop() == 0
