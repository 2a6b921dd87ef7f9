#!/usr/bin/env bash
# Thin pool benchmark: a thin volume against the raw file disk (allocated and first writes)
# and against qemu-nbd serving a qcow2 image. Not run in CI. See bench/thin.py for the method.
#   BENCH_SECONDS=10 BENCH_ROUNDS=3 BENCH_SIZE_MIB=1024 bench/thin.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/strata ] || cargo build --release -p strata
exec /usr/bin/python3 bench/thin.py "$@"
