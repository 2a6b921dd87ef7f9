#!/usr/bin/env bash
# Build the release binary and run the server. With no arguments strata uses
# its embedded defaults (./strata-data, unix socket + 127.0.0.1:10809).
#   ./run.sh                         # defaults
#   ./run.sh --config strata.toml    # any `strata serve` arguments
set -euo pipefail
cd "$(dirname "$0")"
. scripts/ensure-build-tools.sh
cargo build --release
exec target/release/strata serve "$@"
