#!/usr/bin/env bash
# Benchmark strata against qemu-nbd and nbdkit serving the same 1 GiB file,
# and against fio on the file itself (the local limit).  Not run in CI.
#
#   bench/run.sh                    # everything, 15 s per job
#   BENCH_SECONDS=5 bench/run.sh    # shorter runs
#   BENCH_SERVERS="strata qemu-nbd" bench/run.sh
#
# Environment:
#   BENCH_SECONDS   runtime of each fio job (default 10; plus 2 s ramp)
#   BENCH_ROUNDS    rounds; each round runs every server once, in turn, so that drift in
#                   this shared machine's speed hits all servers alike (default 3; the
#                   report takes the median of the rounds)
#   BENCH_SIZE_MIB  size of the test file in MiB (default 1024)
#   BENCH_SERVERS   servers to run (default "strata qemu-nbd nbdkit raw")
#   STRATA_BIN      strata binary (default target/release/strata, built if
#                   missing unless BENCH_NO_BUILD=1)
#   STRATA_BASE_BIN an older strata binary to measure in the same rounds (before/after a
#                   change): adds the server "strata-base" and a "strata / strata-base" column
# Results: bench/out/results/*.json and the markdown table from report.py
# (also written to bench/out/report.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/bench/out
RES=$OUT/results
SECONDS_PER_JOB=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_ROUNDS:-3}
SIZE_MIB=${BENCH_SIZE_MIB:-1024}
STRATA_BIN=${STRATA_BIN:-$ROOT/target/release/strata}
STRATA_BASE_BIN=${STRATA_BASE_BIN:-}
DEFAULT_SERVERS="strata${STRATA_BASE_BIN:+ strata-base} qemu-nbd nbdkit raw"
SERVERS=${BENCH_SERVERS:-$DEFAULT_SERVERS}
IMG=$OUT/disk.img
SOCK_DIR=$(mktemp -d /tmp/strata-bench.XXXXXX)
SOCK=$SOCK_DIR/nbd.sock
SERVER_PID=""

mkdir -p "$RES"
rm -f "$RES"/*.json "$RES"/*.txt

log() { printf '==> %s\n' "$*" >&2; }

cleanup() {
    stop_server
    rm -rf "$SOCK_DIR"
}
trap cleanup EXIT

for tool in fio qemu-nbd nbdkit /usr/bin/python3; do
    command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install fio qemu-utils nbdkit)" >&2; exit 1; }
done

drop_caches() {
    sync
    if ! (echo 3 >/proc/sys/vm/drop_caches) 2>/dev/null; then
        [ -n "${DROP_WARNED:-}" ] || log "cannot drop page cache here (container?); results include cached reads"
        DROP_WARNED=1
    fi
}

# ---- the test file: fully written so reads hit real data ------------------------
if [ ! -f "$IMG" ] || [ "$(stat -c %s "$IMG")" -ne $((SIZE_MIB * 1024 * 1024)) ]; then
    log "writing ${SIZE_MIB} MiB of random data to $IMG"
    dd if=/dev/urandom of="$IMG" bs=1M count="$SIZE_MIB" status=none conv=fsync
fi

# ---- servers ---------------------------------------------------------------------
wait_for_socket() {
    local deadline=$((SECONDS + 30))
    while [ $SECONDS -lt $deadline ]; do
        if [ -S "$SOCK" ] && /usr/bin/python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])" "$SOCK" 2>/dev/null; then
            return 0
        fi
        kill -0 "$SERVER_PID" 2>/dev/null || { log "server exited"; return 1; }
        sleep 0.1
    done
    log "server did not come up"
    return 1
}

start_strata() { # binary server-name
    local bin=$1 name=$2
    if [ ! -x "$bin" ] && [ "$bin" = "$STRATA_BIN" ] && [ -z "${BENCH_NO_BUILD:-}" ]; then
        log "building strata (cargo build --release)"
        cargo build --release >&2
    fi
    [ -x "$bin" ] || { log "no strata binary at $bin"; return 1; }
    cat >"$SOCK_DIR/strata.toml" <<EOF
data-dir = "."
listen = ["unix:nbd.sock"]
admin = "admin.sock"

[[disk]]
name = "bench"
path = "$IMG"
size = "${SIZE_MIB}MiB"
direct = false

[[export]]
name = "bench"
device = "bench"
EOF
    "$bin" serve --config "$SOCK_DIR/strata.toml" >"$OUT/strata.stdout" 2>"$OUT/strata.stderr" &
    SERVER_PID=$!
    local deadline=$((SECONDS + 30))
    until grep -q '^ready:' "$OUT/strata.stdout" 2>/dev/null; do
        kill -0 "$SERVER_PID" 2>/dev/null || { log "strata exited: $(tail -5 "$OUT/strata.stderr")"; return 1; }
        [ $SECONDS -lt $deadline ] || { log "strata not ready"; return 1; }
        sleep 0.05
    done
    sleep 1
    awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status" >"$RES/$name-idle-rss-kib.txt"
}

start_qemu_nbd() {
    qemu-nbd -f raw -t -e 64 -x bench -k "$SOCK" --cache=writeback --aio=threads "$IMG" \
        >"$OUT/qemu-nbd.log" 2>&1 &
    SERVER_PID=$!
    wait_for_socket
}

start_nbdkit() {
    nbdkit -f -U "$SOCK" -e bench file "$IMG" >"$OUT/nbdkit.log" 2>&1 &
    SERVER_PID=$!
    wait_for_socket
}

stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
    rm -f "$SOCK"
}

# ---- workloads -------------------------------------------------------------------
# name rw bs iodepth
WORKLOADS=(
    "randread-4k randread 4k 32"
    "randwrite-4k randwrite 4k 32"
    "seqread-1m read 1M 8"
    "seqwrite-1m write 1M 8"
)

RAW_ENGINE=io_uring
if ! fio --name=probe --filename="$IMG" --size=1m --rw=read --bs=4k --ioengine=io_uring --iodepth=1 \
        --readonly --output=/dev/null >/dev/null 2>&1; then
    RAW_ENGINE=libaio
fi

run_fio() { # round server workload rw bs iodepth
    local round=$1 server=$2 name=$3 rw=$4 bs=$5 qd=$6 target
    if [ "$server" = raw ]; then
        target=(--ioengine="$RAW_ENGINE" --filename="$IMG")
    else
        target=(--ioengine=nbd --uri="nbd+unix:///bench?socket=$SOCK")
    fi
    drop_caches
    log "round $round: $server $name (${SECONDS_PER_JOB}s)"
    fio --name="$name" "${target[@]}" --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=1 \
        --time_based --runtime="$SECONDS_PER_JOB" --ramp_time=2 --size="${SIZE_MIB}m" \
        --randrepeat=0 --norandommap --refill_buffers \
        --output-format=json --output="$RES/$server-$name-r$round.json"
}

for round in $(seq 1 "$ROUNDS"); do
    for server in $SERVERS; do
        case $server in
            strata) start_strata "$STRATA_BIN" strata || { log "skipping strata"; stop_server; continue; } ;;
            strata-base) start_strata "$STRATA_BASE_BIN" strata-base || { log "skipping strata-base"; stop_server; continue; } ;;
            qemu-nbd) start_qemu_nbd || { stop_server; continue; } ;;
            nbdkit) start_nbdkit || { stop_server; continue; } ;;
            raw) ;;
            *) log "unknown server $server"; exit 1 ;;
        esac
        for w in "${WORKLOADS[@]}"; do
            # shellcheck disable=SC2086
            run_fio "$round" "$server" $w || log "fio failed for $server $w"
        done
        if [ "${server%-base}" = strata ]; then
            # Resident memory once the load is over: what an idle server keeps.
            sleep 5
            awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status" >"$RES/$server-loaded-rss-kib.txt" || true
        fi
        stop_server
    done
done

echo "$RAW_ENGINE" >"$RES/raw-engine.txt"
/usr/bin/python3 "$ROOT/bench/report.py" "$RES" | tee "$OUT/report.md"
