#!/usr/bin/env bash
# The one command that checks Strata: installs what the tests need when it is
# missing, then runs format/lint checks, unit tests, the release build and the
# end-to-end suite (tests/integration) against target/release/strata.
set -euo pipefail
cd "$(dirname "$0")"
. scripts/ensure-build-tools.sh

log() { printf '\n==> [%ss] %s\n' "$SECONDS" "$*"; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

# ---- system packages ---------------------------------------------------------
need_pkgs=()
have() { command -v "$1" >/dev/null 2>&1; }
have fio          || need_pkgs+=(fio)
have nbdkit       || need_pkgs+=(nbdkit)
have nbdinfo      || need_pkgs+=(libnbd-bin)
have nbdcopy      || need_pkgs+=(libnbd-bin)
have nbdfuse      || need_pkgs+=(nbdfuse)
have fusermount3  || need_pkgs+=(fuse3)
have mkfs.ext4    || [ -x /usr/sbin/mkfs.ext4 ] || [ -x /sbin/mkfs.ext4 ] || need_pkgs+=(e2fsprogs)
have qemu-img     || need_pkgs+=(qemu-utils)
have qemu-io      || need_pkgs+=(qemu-utils)
have certtool     || need_pkgs+=(gnutls-bin)
have psktool      || need_pkgs+=(gnutls-bin)
have etcd         || need_pkgs+=(etcd-server)
have mold         || need_pkgs+=(mold)
[ -x /usr/bin/python3 ] || need_pkgs+=(python3)
if [ -x /usr/bin/python3 ]; then
    /usr/bin/python3 -c 'import nbd' 2>/dev/null           || need_pkgs+=(python3-libnbd)
    /usr/bin/python3 -c 'import pytest' 2>/dev/null        || need_pkgs+=(python3-pytest)
    /usr/bin/python3 -c 'import pytest_timeout' 2>/dev/null || need_pkgs+=(python3-pytest-timeout)
    /usr/bin/python3 -c 'import xdist' 2>/dev/null         || need_pkgs+=(python3-pytest-xdist)
else
    need_pkgs+=(python3-libnbd python3-pytest python3-pytest-timeout python3-pytest-xdist)
fi
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    log "installing: ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"
fi

# ---- rust components -----------------------------------------------------------
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    log "installing rustfmt and clippy"
    rustup component add rustfmt clippy
fi

# ---- checks ----------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy"
CARGO_INCREMENTAL=0 cargo clippy --workspace --all-targets -- -D warnings

log "cargo test"
# Unit, property and suite tests. Not the examples (clippy --all-targets checks they build)
# nor doc-tests (the crates have none to run): rustdoc over sixteen crates costs CI time.
# (A clean build gains nothing from incremental compilation's bookkeeping, here or in
# clippy.)
CARGO_INCREMENTAL=0 cargo test --workspace --lib --bins --tests

log "cargo build --release"
cargo build --release

log "integration tests (tests/integration)"
export STRATA_BIN="${STRATA_BIN:-$PWD/target/release/strata}"
# Two processes, each taking whole files (`--dist loadfile`: a file's tests share fixtures and
# run in order): most of these tests wait on servers, leases and disks, not on the CPU, and
# the suite took 436 s in one process, 233 s in two (2 cores). STRATA_TEST_WORKERS=0 runs it
# in this process, without workers.
/usr/bin/python3 -m pytest -q -p no:cacheprovider --durations=25 \
    -n "${STRATA_TEST_WORKERS:-2}" --dist loadfile tests/integration
log "all checks passed"
