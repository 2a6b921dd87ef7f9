#!/usr/bin/env bash
# Strata's NBD client vs fio's nbd engine on one `strata serve` brick, plaintext and TLS.
# Not run in CI. See bench/remote.py for the method.
#   BENCH_SECONDS=10 BENCH_ROUNDS=3 bench/remote.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p strata -p strata-nbd --example client_bench
exec /usr/bin/python3 bench/remote.py "$@"
