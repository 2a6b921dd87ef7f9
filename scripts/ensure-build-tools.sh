# Sourced by run.sh and test.sh: on a fresh Debian machine, install Rust with rustup
# (Debian's own cargo is too old for this workspace), and protoc.
if ! command -v cargo >/dev/null 2>&1; then
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "==> installing Rust (rustup, stable)" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    command -v curl >/dev/null 2>&1 || { $SUDO apt-get update -q && $SUDO apt-get install -y -q curl ca-certificates build-essential; }
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy
    . "$HOME/.cargo/env"
fi

# etcd-client (strata-coord's etcd client) generates its gRPC code at build time with protoc,
# and its protos import protobuf's own (google/protobuf/descriptor.proto, struct.proto): those
# come in libprotobuf-dev, which protobuf-compiler only recommends, so without recommends
# protoc alone is installed and the build fails.
if ! command -v protoc >/dev/null 2>&1 || [ ! -f /usr/include/google/protobuf/descriptor.proto ]; then
    echo "==> installing protoc and protobuf's own protos (protobuf-compiler, libprotobuf-dev)" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends protobuf-compiler libprotobuf-dev
fi
