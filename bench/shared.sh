#!/usr/bin/env bash
# What consistency intervals cost a client: fio through qemu-nbd on a raw file, a Strata mirror
# of two NBD bricks, a Strata shared volume written through without intervals (the baseline),
# and a Strata shared volume over two bricks. Not run in CI. See
# bench/shared.py for the method.
#   BENCH_SECONDS=10 BENCH_ROUNDS=3 bench/shared.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p strata
exec /usr/bin/python3 bench/shared.py "$@"
