//! The server driven over in-memory pipes by a minimal scripted client: ordering, limits and
//! hostile input, checked byte by byte.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use strata_backend::MemoryDevice;
use strata_core::{async_trait, BlockDevice, Result, WriteFlags};
use strata_crash::testkit::{Intercepted, Interceptor, Request as DeviceRequest};
use strata_nbd::proto::*;
use strata_nbd::{Export, Exports, Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

const SIZE: u64 = 1 << 20;

/// Holds reads at offset 0 until told to go, to force out-of-order replies.
#[derive(Default)]
struct Gate {
    open: tokio::sync::Notify,
}

#[async_trait]
impl Interceptor for Gate {
    async fn before(&self, request: DeviceRequest) -> Result<()> {
        if let DeviceRequest::Read { offset: 0, .. } = request {
            self.open.notified().await;
        }
        Ok(())
    }
}

/// A memory device behind a [`Gate`].
fn gated() -> Arc<Intercepted<Gate>> {
    Intercepted::new(Arc::new(MemoryDevice::new(SIZE)), Gate::default())
}

fn exports_with(device: Arc<dyn BlockDevice>, read_only: bool) -> Arc<Exports> {
    let exports = Arc::new(Exports::new());
    exports.insert(Export {
        name: "vol".into(),
        description: "test volume".into(),
        device,
        read_only,
        allow: Vec::new(),
    });
    exports
}

/// Starts a server session on one end of a pipe and returns the client end.
fn connect(exports: Arc<Exports>, limits: Limits, pipe_bytes: usize) -> DuplexStream {
    let (client, server_end) = tokio::io::duplex(pipe_bytes);
    let server = Server::new(exports, limits);
    tokio::spawn(server.serve_stream(server_end, "test".into()));
    client
}

async fn expect_u64(client: &mut DuplexStream, expected: u64) {
    assert_eq!(client.read_u64().await.unwrap(), expected);
}

/// Fixed-newstyle handshake with STRUCTURED_REPLY (optional) and GO "vol".
async fn handshake(client: &mut DuplexStream, structured: bool) {
    expect_u64(client, NBDMAGIC).await;
    expect_u64(client, IHAVEOPT).await;
    let flags = client.read_u16().await.unwrap();
    assert_eq!(flags, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    client
        .write_u32(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .await
        .unwrap();
    if structured {
        send_option(client, OPT_STRUCTURED_REPLY, &[]).await;
        assert_eq!(read_option_reply(client).await.0, REP_ACK);
    }
    let mut go = BytesMut::new();
    go.put_u32(3);
    go.put_slice(b"vol");
    go.put_u16(0);
    send_option(client, OPT_GO, &go).await;
    loop {
        let (reply, _) = read_option_reply(client).await;
        if reply == REP_ACK {
            break;
        }
        assert_eq!(reply, REP_INFO);
    }
}

async fn send_option(client: &mut DuplexStream, option: u32, data: &[u8]) {
    let mut out = BytesMut::new();
    out.put_u64(IHAVEOPT);
    out.put_u32(option);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
    client.write_all(&out).await.unwrap();
}

async fn read_option_reply(client: &mut DuplexStream) -> (u32, Vec<u8>) {
    expect_u64(client, OPTION_REPLY_MAGIC).await;
    let _option = client.read_u32().await.unwrap();
    let reply = client.read_u32().await.unwrap();
    let len = client.read_u32().await.unwrap();
    let mut data = vec![0; len as usize];
    client.read_exact(&mut data).await.unwrap();
    (reply, data)
}

async fn request(client: &mut DuplexStream, kind: u16, handle: u64, offset: u64, length: u32) {
    let mut out = BytesMut::new();
    Request {
        flags: 0,
        kind,
        handle,
        offset,
        length,
    }
    .encode(&mut out);
    client.write_all(&out).await.unwrap();
}

/// Reads one simple reply: (error, handle).
async fn simple_reply(client: &mut DuplexStream) -> (u32, u64) {
    assert_eq!(client.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
    let error = client.read_u32().await.unwrap();
    (error, client.read_u64().await.unwrap())
}

#[tokio::test]
async fn replies_come_back_out_of_order() {
    let gate = gated();
    let mut client = connect(
        exports_with(gate.clone(), false),
        Limits::default(),
        1 << 20,
    );
    handshake(&mut client, false).await;
    request(&mut client, CMD_READ, 1, 0, 512).await;
    request(&mut client, CMD_READ, 2, 4096, 512).await;
    // The second read overtakes the first, which waits at the gate.
    assert_eq!(simple_reply(&mut client).await, (0, 2));
    let mut data = [0u8; 512];
    client.read_exact(&mut data).await.unwrap();
    gate.open.notify_one();
    assert_eq!(simple_reply(&mut client).await, (0, 1));
    client.read_exact(&mut data).await.unwrap();
    assert_eq!(data, [0u8; 512]);
}

#[tokio::test]
async fn oversize_read_is_refused_and_the_session_goes_on() {
    let device = Arc::new(MemoryDevice::new(SIZE));
    let limits = Limits {
        max_payload: 64 * 1024,
        max_buffered_bytes: 128 * 1024,
        ..Limits::default()
    };
    let mut client = connect(exports_with(device, false), limits, 1 << 20);
    handshake(&mut client, false).await;
    request(&mut client, CMD_READ, 7, 0, 512 * 1024).await;
    assert_eq!(simple_reply(&mut client).await, (22, 7));
    // An oversize write's payload is skipped, and the next request is parsed correctly.
    let mut out = BytesMut::new();
    Request {
        flags: 0,
        kind: CMD_WRITE,
        handle: 8,
        offset: 0,
        length: 100_000,
    }
    .encode(&mut out);
    out.put_bytes(0xaa, 100_000);
    client.write_all(&out).await.unwrap();
    assert_eq!(simple_reply(&mut client).await, (22, 8));
    request(&mut client, CMD_FLUSH, 9, 0, 0).await;
    assert_eq!(simple_reply(&mut client).await, (0, 9));
}

#[tokio::test]
async fn errors_follow_the_spec() {
    let device = Arc::new(MemoryDevice::new(SIZE));
    let mut client = connect(
        exports_with(device.clone(), false),
        Limits::default(),
        1 << 20,
    );
    handshake(&mut client, false).await;
    request(&mut client, 0x77, 1, 0, 0).await;
    assert_eq!(
        simple_reply(&mut client).await,
        (22, 1),
        "unknown command: EINVAL"
    );
    request(&mut client, CMD_READ, 2, SIZE - 1, 2).await;
    assert_eq!(
        simple_reply(&mut client).await,
        (22, 2),
        "read past the end: EINVAL"
    );
    request(&mut client, CMD_WRITE_ZEROES, 3, SIZE, 4096).await;
    assert_eq!(
        simple_reply(&mut client).await,
        (28, 3),
        "zero past the end: ENOSPC"
    );
    request(&mut client, CMD_BLOCK_STATUS, 4, 0, 4096).await;
    assert_eq!(
        simple_reply(&mut client).await,
        (22, 4),
        "no meta context: EINVAL"
    );

    let mut ro = connect(exports_with(device, true), Limits::default(), 1 << 20);
    handshake(&mut ro, false).await;
    request(&mut ro, CMD_TRIM, 5, 0, 4096).await;
    assert_eq!(
        simple_reply(&mut ro).await,
        (1, 5),
        "trim on a read-only export: EPERM"
    );
}

#[tokio::test]
async fn structured_read_and_block_status() {
    let device = Arc::new(MemoryDevice::new(SIZE));
    device
        .write(
            8192,
            bytes::Bytes::from(vec![1u8; 4096]),
            WriteFlags::default(),
        )
        .await
        .unwrap();
    let mut client = connect(exports_with(device, false), Limits::default(), 1 << 20);
    expect_u64(&mut client, NBDMAGIC).await;
    expect_u64(&mut client, IHAVEOPT).await;
    client.read_u16().await.unwrap();
    client
        .write_u32(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .await
        .unwrap();
    send_option(&mut client, OPT_STRUCTURED_REPLY, &[]).await;
    assert_eq!(read_option_reply(&mut client).await.0, REP_ACK);
    let mut meta = BytesMut::new();
    meta.put_u32(3);
    meta.put_slice(b"vol");
    meta.put_u32(1);
    meta.put_u32(BASE_ALLOCATION.len() as u32);
    meta.put_slice(BASE_ALLOCATION.as_bytes());
    send_option(&mut client, OPT_SET_META_CONTEXT, &meta).await;
    let (reply, data) = read_option_reply(&mut client).await;
    assert_eq!(reply, REP_META_CONTEXT);
    assert_eq!(&data[4..], BASE_ALLOCATION.as_bytes());
    assert_eq!(read_option_reply(&mut client).await.0, REP_ACK);
    let mut go = BytesMut::new();
    go.put_u32(3);
    go.put_slice(b"vol");
    go.put_u16(0);
    send_option(&mut client, OPT_GO, &go).await;
    while read_option_reply(&mut client).await.0 != REP_ACK {}

    request(&mut client, CMD_BLOCK_STATUS, 1, 0, 16384).await;
    assert_eq!(client.read_u32().await.unwrap(), STRUCTURED_REPLY_MAGIC);
    assert_eq!(client.read_u16().await.unwrap(), REPLY_FLAG_DONE);
    assert_eq!(client.read_u16().await.unwrap(), REPLY_TYPE_BLOCK_STATUS);
    assert_eq!(client.read_u64().await.unwrap(), 1);
    let length = client.read_u32().await.unwrap();
    let mut payload = vec![0u8; length as usize];
    client.read_exact(&mut payload).await.unwrap();
    let words: Vec<u32> = payload
        .chunks(4)
        .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
        .collect();
    assert_eq!(words, vec![BASE_ALLOCATION_ID, 8192, 3, 4096, 0, 4096, 3]);

    request(&mut client, CMD_READ, 2, 8192, 16).await;
    assert_eq!(client.read_u32().await.unwrap(), STRUCTURED_REPLY_MAGIC);
    assert_eq!(client.read_u16().await.unwrap(), REPLY_FLAG_DONE);
    assert_eq!(client.read_u16().await.unwrap(), REPLY_TYPE_OFFSET_DATA);
    assert_eq!(client.read_u64().await.unwrap(), 2);
    assert_eq!(client.read_u32().await.unwrap(), 8 + 16);
    assert_eq!(client.read_u64().await.unwrap(), 8192);
    let mut data = [0u8; 16];
    client.read_exact(&mut data).await.unwrap();
    assert_eq!(data, [1u8; 16]);
}

#[tokio::test]
async fn bad_magic_drops_only_that_client() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(SIZE));
    let exports = exports_with(device, false);
    let mut bad = connect(exports.clone(), Limits::default(), 1 << 20);
    let mut good = connect(exports, Limits::default(), 1 << 20);
    handshake(&mut bad, false).await;
    handshake(&mut good, false).await;
    bad.write_all(&[0xff; 28]).await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), bad.read_to_end(&mut rest))
        .await
        .expect("server must hang up")
        .unwrap();
    assert_eq!(n, 0, "no reply to garbage");
    request(&mut good, CMD_FLUSH, 1, 0, 0).await;
    assert_eq!(simple_reply(&mut good).await, (0, 1));
}

#[tokio::test]
async fn a_client_that_stops_reading_stops_being_read() {
    let device = Arc::new(MemoryDevice::new(SIZE));
    let limits = Limits {
        max_payload: 64 * 1024,
        max_buffered_bytes: 256 * 1024,
        max_in_flight: 64,
        ..Limits::default()
    };
    // A small pipe: replies back up quickly.
    let mut client = connect(exports_with(device, false), limits, 64 * 1024);
    handshake(&mut client, false).await;
    let mut header = BytesMut::new();
    let mut sent = 0u64;
    // Send 64 KiB reads without reading replies until the server stops taking requests.
    loop {
        header.clear();
        Request {
            flags: 0,
            kind: CMD_READ,
            handle: sent,
            offset: 0,
            length: 64 * 1024,
        }
        .encode(&mut header);
        let wrote =
            tokio::time::timeout(Duration::from_millis(300), client.write_all(&header)).await;
        if wrote.is_err() {
            break;
        }
        sent += 1;
        assert!(
            sent < 10_000,
            "the server kept reading requests it could not answer"
        );
    }
    // Budget (256 KiB = 4 reads) + replies in the pipe (64 KiB) + requests buffered by the
    // server's reader (128 KiB of 28-byte headers) + the pipe itself bound what was accepted.
    assert!(sent > 4, "sent {sent}");
    // Now drain: every accepted request is answered.
    let mut answered = 0u64;
    let mut data = vec![0u8; 64 * 1024];
    while answered < sent {
        let (error, _) = tokio::time::timeout(Duration::from_secs(5), simple_reply(&mut client))
            .await
            .expect("replies resume once the client reads");
        assert_eq!(error, 0);
        client.read_exact(&mut data).await.unwrap();
        answered += 1;
    }
}

#[tokio::test]
async fn disconnecting_an_export_answers_in_flight_requests_then_closes() {
    let gate = gated();
    let exports = exports_with(gate.clone(), false);
    let export = exports.lookup("vol").unwrap();
    let server = Server::new(exports.clone(), Limits::default());
    let (mut client, server_end) = tokio::io::duplex(1 << 20);
    tokio::spawn(server.clone().serve_stream(server_end, "test".into()));
    handshake(&mut client, false).await;
    assert_eq!(server.clients_of(&export), 1);
    // Another export of the same name (a volume deleted and made again) is not this one.
    exports.insert(Export {
        name: "vol".into(),
        description: "a newer volume".into(),
        device: Arc::new(MemoryDevice::new(SIZE)),
        read_only: false,
        allow: Vec::new(),
    });
    assert_eq!(server.clients_of(&exports.lookup("vol").unwrap()), 0);

    request(&mut client, CMD_READ, 7, 0, 512).await; // held at the gate
    tokio::time::sleep(Duration::from_millis(20)).await;
    let disconnecting = {
        let server = server.clone();
        let export = export.clone();
        tokio::spawn(async move { server.disconnect(&export, Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        !disconnecting.is_finished(),
        "waits for the request in flight"
    );
    gate.open.notify_one();
    assert_eq!(simple_reply(&mut client).await, (0, 7));
    let mut data = [0u8; 512];
    client.read_exact(&mut data).await.unwrap();
    assert_eq!(disconnecting.await.unwrap(), 0, "every session ended");
    assert_eq!(server.clients_of(&export), 0);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest))
        .await
        .expect("the server closes the connection")
        .unwrap();
    assert!(rest.is_empty(), "the connection was closed");
}
