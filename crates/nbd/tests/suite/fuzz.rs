//! Hostile bytes from a client never panic the server, never hang it, and never disturb the
//! data. A stable-toolchain stand-in for a coverage-guided fuzzer: proptest throws random and
//! mutated protocol streams at a real session.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::BlockDevice;
use strata_nbd::proto::*;
use strata_nbd::{Export, Exports, Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

/// A plausible client prefix: flags, STRUCTURED_REPLY, SET_META_CONTEXT, GO.
fn valid_prefix() -> Vec<u8> {
    let mut out = BytesMut::new();
    out.put_u32(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let option = |out: &mut BytesMut, code: u32, data: &[u8]| {
        out.put_u64(IHAVEOPT);
        out.put_u32(code);
        out.put_u32(data.len() as u32);
        out.put_slice(data);
    };
    option(&mut out, OPT_STRUCTURED_REPLY, &[]);
    let mut meta = BytesMut::new();
    meta.put_u32(0);
    meta.put_u32(1);
    meta.put_u32(BASE_ALLOCATION.len() as u32);
    meta.put_slice(BASE_ALLOCATION.as_bytes());
    option(&mut out, OPT_SET_META_CONTEXT, &meta);
    let mut go = BytesMut::new();
    go.put_u32(0);
    go.put_u16(0);
    option(&mut out, OPT_GO, &go);
    out.to_vec()
}

/// Requests with random fields (a valid magic most of the time).
fn request_stream() -> impl Strategy<Value = Vec<u8>> {
    let request = (
        any::<bool>(),
        any::<u16>(),
        0u16..10,
        any::<u64>(),
        0u64..(1 << 17),
        0u32..(1 << 17),
    )
        .prop_map(|(good_magic, flags, kind, handle, offset, length)| {
            let mut out = BytesMut::new();
            out.put_u32(if good_magic {
                REQUEST_MAGIC
            } else {
                0x1234_5678
            });
            out.put_u16(flags & 0x3f);
            out.put_u16(kind);
            out.put_u64(handle);
            out.put_u64(offset);
            out.put_u32(length);
            if kind == CMD_WRITE {
                out.put_bytes(0xee, (length as usize).min(4096));
            }
            out.to_vec()
        });
    proptest::collection::vec(request, 0..24).prop_map(|v| v.concat())
}

fn run_session(input: Vec<u8>) {
    count_panics();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let device = Arc::new(MemoryDevice::new(1 << 16));
        device
            .write(0, bytes::Bytes::from(vec![7u8; 4096]), Default::default())
            .await
            .unwrap();
        let exports = Arc::new(Exports::new());
        exports.insert(Export {
            name: "vol".into(),
            description: String::new(),
            device: device.clone(),
            read_only: true,
            allow: Vec::new(),
        });
        let limits = Limits {
            max_payload: 1 << 16,
            max_buffered_bytes: 1 << 18,
            ..Limits::default()
        };
        let server = Server::new(exports, limits);
        let (mut client, server_end) = tokio::io::duplex(1 << 16);
        let session = tokio::spawn(server.serve_stream(server_end, "fuzz".into()));
        let (mut rx, mut tx) = tokio::io::split(&mut client);
        let writer = async {
            let _ = tx.write_all(&input).await;
            let _ = tx.shutdown().await;
        };
        let reader = async {
            let mut sink = Vec::new();
            let _ = rx.read_to_end(&mut sink).await;
            sink
        };
        let both = async { tokio::join!(writer, reader) };
        let ((), replies) = tokio::time::timeout(Duration::from_secs(10), both)
            .await
            .expect("the server must finish with a client that hung up");
        assert_eq!(
            &replies[..8],
            &NBDMAGIC.to_be_bytes(),
            "every session starts with a greeting"
        );
        tokio::time::timeout(Duration::from_secs(10), session)
            .await
            .expect("the session must end")
            .expect("the session task must not panic");
        let check = device.read(0, 4096).await.unwrap();
        assert!(check.iter().all(|&b| b == 7), "a read-only export changed");
    });
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a task panicked");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_from_the_start(input in proptest::collection::vec(any::<u8>(), 0..512)) {
        run_session(input);
    }

    #[test]
    fn mutated_handshakes(flips in proptest::collection::vec((0usize..200, any::<u8>()), 0..4)) {
        let mut input = valid_prefix();
        for (at, byte) in flips {
            let at = at % input.len();
            input[at] = byte;
        }
        run_session(input);
    }

    #[test]
    fn random_requests_after_a_valid_handshake(requests in request_stream()) {
        let mut input = valid_prefix();
        input.extend(requests);
        run_session(input);
    }
}
