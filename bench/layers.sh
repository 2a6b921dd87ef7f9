#!/usr/bin/env bash
# Layer scaling benchmark: stripe and raid5 over bandwidth-limited members, against one
# member limited the same way. Not run in CI. See bench/layers.py for the method.
#   BENCH_SECONDS=10 BENCH_ROUNDS=3 BENCH_MEMBER_BW=100MiB bench/layers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/strata ] || cargo build --release -p strata
exec /usr/bin/python3 bench/layers.py "$@"
