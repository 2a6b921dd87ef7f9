#!/usr/bin/env bash
# Proximal I/O in real mode: 4 KiB random writes to a stage over a modelled WD RE3 disk, against
# the disk alone and the same stage writing back in address order. Not run in CI. See
# bench/stage.py for the method.
#   BENCH_SECONDS=30 BENCH_ROUNDS=3 BENCH_VOLUME_GIB=100 bench/stage.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/strata ] || cargo build --release -p strata
exec /usr/bin/python3 bench/stage.py "$@"
