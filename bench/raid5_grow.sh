#!/usr/bin/env bash
# raid5 grow benchmark: offline grow against the bandwidth bound (ALV and MD-Reshape), and
# user p99 latency under fio with and without a grow. Not run in CI. See bench/raid5_grow.py.
#   BENCH_SECONDS=20 BENCH_DISK_MIB=512 BENCH_MEMBER_BW=100MiB bench/raid5_grow.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/strata ] || cargo build --release -p strata
exec /usr/bin/python3 bench/raid5_grow.py "$@"
