#!/usr/bin/env bash
# A single-node etcd for development, in ./strata-data/etcd, on 127.0.0.1:2379 (clients) and
# :2380 (peers). Strata's coordination (crates/coord) connects to http://127.0.0.1:2379.
#   scripts/dev-etcd.sh            # foreground; Ctrl-C stops it, the data stays
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v etcd >/dev/null 2>&1; then
    echo "etcd is missing: apt-get install etcd-server" >&2
    exit 1
fi
mkdir -p strata-data
exec etcd --name dev --data-dir strata-data/etcd \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster dev=http://127.0.0.1:2380
