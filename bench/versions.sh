#!/usr/bin/env bash
# Versions benchmark: 4 KiB random writes after 0/1/10/100 snapshots, remap vs copy mode,
# qemu-nbd with qcow2 snapshots and backing chains, snapshot create latency at 1 GiB and
# 1 TiB, memory per shared extent. Not run in CI. See bench/versions.py for the method.
#   BENCH_SECONDS=10 BENCH_ROUNDS=3 bench/versions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/strata ] || cargo build --release -p strata
exec /usr/bin/python3 bench/versions.py "$@"
