//! The NBD client against our own server (a memory device on a unix socket) and against a
//! fake server that misbehaves on purpose.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::{
    async_trait, BlockDevice, BlockError, Control, ControlReply, DeviceRef, Health, Result,
    WriteFlags, ZeroFlags,
};
use strata_crash::testkit::{Intercepted, Interceptor, Request as DeviceRequest};
use strata_nbd::client::{Client, ClientError, ClientOptions, NbdUri, RemoteDevice};
use strata_nbd::proto::Request;
use strata_nbd::proto::*;
use strata_nbd::{Export, Exports, Limits, Listener, Server};
use tokio::net::UnixListener;

use crate::fake_server;

const SIZE: u64 = 4 << 20;

/// A server in a runtime of its own, so that a test can kill it outright: shutting the
/// runtime down drops every connection without a word, as a crashed process would.
struct Brick {
    runtime: Option<tokio::runtime::Runtime>,
    server: Arc<Server>,
}

impl Brick {
    fn start(device: DeviceRef, socket: &Path, limits: Limits) -> Brick {
        let _ = std::fs::remove_file(socket);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let exports = Arc::new(Exports::new());
        exports.insert(Export {
            name: "vol".into(),
            description: String::new(),
            device,
            read_only: false,
            allow: Vec::new(),
        });
        let server = Server::new(exports, limits);
        let listener = {
            let _context = runtime.enter();
            UnixListener::bind(socket).unwrap()
        };
        runtime.spawn(server.clone().run(Listener::Unix {
            listener,
            path: socket.to_path_buf(),
        }));
        Brick {
            runtime: Some(runtime),
            server,
        }
    }

    /// Drops every task of the server, and with them its sockets, before returning: a test
    /// that kills a brick must not have its next request answered by the dying one. (The
    /// runtime is shut down from a thread of its own: blocking on it is not allowed from the
    /// test's async context.)
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            std::thread::spawn(move || runtime.shutdown_timeout(Duration::from_secs(5)))
                .join()
                .expect("the brick's runtime shut down");
        }
    }
}

impl Drop for Brick {
    fn drop(&mut self) {
        self.kill();
    }
}

fn uri(socket: &Path) -> NbdUri {
    format!("nbd+unix:///vol?socket={}", socket.display())
        .parse()
        .unwrap()
}

fn options(timeout: Duration) -> ClientOptions {
    ClientOptions {
        timeout,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
        connections: 1,
    }
}

fn pattern(seed: u8, len: usize) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("brick.sock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_round_trips_and_lands_on_the_brick() {
    let dir = tempfile::tempdir().unwrap();
    let memory = Arc::new(MemoryDevice::new(SIZE));
    let _brick = Brick::start(memory.clone(), &socket_in(&dir), Limits::default());
    let remote = RemoteDevice::connect(uri(&socket_in(&dir)), options(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(remote.geometry().size, SIZE);
    let caps = remote.capabilities();
    assert!(caps.flush && caps.fua && caps.discard && caps.write_zeroes);

    let data = pattern(1, 64 * 1024);
    remote
        .write(4096, data.clone(), WriteFlags { fua: true })
        .await
        .unwrap();
    assert_eq!(&remote.read(4096, data.len()).await.unwrap()[..], &data[..]);
    assert_eq!(&memory.read(4096, data.len()).await.unwrap()[..], &data[..]);
    remote.flush().await.unwrap();

    remote
        .write_zeroes(8192, 8192, ZeroFlags::default())
        .await
        .unwrap();
    let back = memory.read(4096, data.len()).await.unwrap();
    assert!(back[4096..12288].iter().all(|&b| b == 0));
    assert_eq!(&back[..4096], &data[..4096]);
    assert_eq!(&back[12288..], &data[12288..]);

    remote.discard(0, SIZE).await.unwrap();
    let after = memory.read(4096, data.len()).await.unwrap();
    assert!(
        after.iter().all(|&b| b == 0),
        "TRIM reached the memory device"
    );

    // Past the end: refused here, before the wire.
    let err = remote.read(SIZE - 512, 1024).await.unwrap_err();
    assert!(matches!(err, BlockError::OutOfRange { .. }), "{err}");

    // Read-only by our choice: writes are refused, nothing reaches the brick.
    let remote = remote.read_only(true);
    assert!(remote.capabilities().read_only);
    let err = remote
        .write(0, pattern(7, 512), WriteFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BlockError::ReadOnly), "{err}");
    assert!(memory.read(0, 512).await.unwrap().iter().all(|&b| b == 0));
}

/// Holds reads at offset 0 until released, and records the largest request it sees.
struct Gate {
    open: tokio::sync::Semaphore,
    largest: AtomicU64,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            open: tokio::sync::Semaphore::new(0),
            largest: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl Interceptor for Gate {
    async fn before(&self, request: DeviceRequest) -> Result<()> {
        let len = match request {
            DeviceRequest::Read { offset, len } => {
                if offset == 0 {
                    let _ = self.open.acquire().await.map(|p| p.forget());
                }
                len
            }
            DeviceRequest::Write { len, .. } => len,
            _ => 0,
        };
        self.largest.fetch_max(len, Ordering::Relaxed);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_complete_out_of_order() {
    let dir = tempfile::tempdir().unwrap();
    let memory = Arc::new(MemoryDevice::new(SIZE));
    memory
        .write(0, pattern(9, 4096), WriteFlags::default())
        .await
        .unwrap();
    let gated = Intercepted::new(memory.clone(), Gate::default());
    let _brick = Brick::start(gated.clone(), &socket_in(&dir), Limits::default());
    let remote = Arc::new(
        RemoteDevice::connect(uri(&socket_in(&dir)), options(Duration::from_secs(10)))
            .await
            .unwrap(),
    );
    // The first read is held at the brick; 64 writes and reads behind it on the same
    // connection must all finish while it waits.
    let held = tokio::spawn({
        let remote = remote.clone();
        async move { remote.read(0, 4096).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut tasks = Vec::new();
    for i in 1..=64u64 {
        let remote = remote.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 4096);
            remote
                .write(i * 4096, data.clone(), WriteFlags::default())
                .await?;
            let back = remote.read(i * 4096, 4096).await?;
            assert_eq!(&back[..], &data[..]);
            Ok::<_, BlockError>(())
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert!(
        !held.is_finished(),
        "the held read finished before its gate opened"
    );
    gated.open.add_permits(1);
    let first = held.await.unwrap().unwrap();
    assert_eq!(&first[..], &pattern(9, 4096)[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_are_cut_to_the_servers_maximum() {
    let dir = tempfile::tempdir().unwrap();
    let memory = Arc::new(MemoryDevice::new(SIZE));
    let gated = Intercepted::new(memory.clone(), Gate::default());
    gated.open.add_permits(1000);
    let limits = Limits {
        max_payload: 64 * 1024,
        ..Limits::default()
    };
    let _brick = Brick::start(gated.clone(), &socket_in(&dir), limits);
    let client = Client::connect(uri(&socket_in(&dir)), options(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(client.info().max_block, 64 * 1024);
    let data = pattern(3, 1 << 20);
    client.write(8192, data.clone(), false).await.unwrap();
    let back = client.read(8192, data.len()).await.unwrap();
    assert_eq!(&back[..], &data[..]);
    assert_eq!(&memory.read(8192, data.len()).await.unwrap()[..], &data[..]);
    assert_eq!(gated.largest.load(Ordering::Relaxed), 64 * 1024);
}

#[tokio::test]
async fn commands_the_server_does_not_advertise_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // Only HAS_FLAGS: no FLUSH, FUA, TRIM or WRITE_ZEROES. Every request is answered OK.
    let socket = fake_server::start(dir.path(), FLAG_HAS_FLAGS, |r| {
        let mut answer = fake_server::simple_reply(0, r.handle);
        if r.kind == CMD_READ {
            answer.extend(std::iter::repeat_n(0, r.length as usize));
        }
        Some(answer)
    });
    let client = Client::connect(uri(&socket), options(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(matches!(
        client.flush().await,
        Err(ClientError::Unsupported("FLUSH"))
    ));
    assert!(matches!(
        client.trim(0, 4096).await,
        Err(ClientError::Unsupported("TRIM"))
    ));
    assert!(matches!(
        client.write_zeroes(0, 4096, false, false, false).await,
        Err(ClientError::Unsupported("WRITE_ZEROES"))
    ));
    assert!(matches!(
        client.write(0, pattern(0, 512), true).await,
        Err(ClientError::Unsupported("FUA"))
    ));
    client.write(0, pattern(0, 512), false).await.unwrap();
    assert_eq!(client.read(0, 512).await.unwrap().len(), 512);
    // The device keeps the contract without them: zeroes are written, discard is a no-op.
    let device = RemoteDevice::new(client);
    assert!(!device.capabilities().write_zeroes);
    device
        .write_zeroes(0, 4096, ZeroFlags::default())
        .await
        .unwrap();
    device.discard(0, 4096).await.unwrap();
    let fast = ZeroFlags {
        fast: true,
        ..ZeroFlags::default()
    };
    assert!(matches!(
        device.write_zeroes(0, 4096, fast).await,
        Err(BlockError::Unsupported(_))
    ));
}

#[tokio::test]
async fn a_server_error_comes_back_as_its_errno() {
    let dir = tempfile::tempdir().unwrap();
    let flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH;
    let socket = fake_server::start(dir.path(), flags, |r| {
        Some(fake_server::simple_reply(28, r.handle))
    });
    let device = RemoteDevice::connect(uri(&socket), options(Duration::from_secs(5)))
        .await
        .unwrap();
    let err = device
        .write(0, pattern(0, 512), WriteFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(err, BlockError::NoSpace), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_fails_every_request_in_flight_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let memory = Arc::new(MemoryDevice::new(SIZE));
    let gated = Intercepted::new(memory, Gate::default());
    let mut brick = Brick::start(gated, &socket_in(&dir), Limits::default());
    let timeout = Duration::from_millis(800);
    let remote = Arc::new(
        RemoteDevice::connect(uri(&socket_in(&dir)), options(timeout))
            .await
            .unwrap(),
    );
    // Eight reads held at the brick, then the brick dies under them.
    let started = Instant::now();
    let held: Vec<_> = (0..8)
        .map(|_| {
            let remote = remote.clone();
            tokio::spawn(async move { remote.read(0, 4096).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    brick.kill();
    for task in held {
        let err = task.await.unwrap().unwrap_err();
        assert_eq!(err.errno(), strata_core::errno::EIO, "{err}");
        assert!(err.to_string().contains("brick.sock"), "{err}");
        // Failed by the lost connection (and the reconnects after it), not merely timed out.
        assert!(err.to_string().contains("the last attempt failed"), "{err}");
    }
    assert!(
        started.elapsed() < timeout + Duration::from_millis(600),
        "took {:?}",
        started.elapsed()
    );
    // Status calls the brick what it is until a request gets through again.
    let ControlReply::Describe(status) = remote.control(Control::Describe).await.unwrap() else {
        panic!("Describe answers with a status");
    };
    assert_eq!(status.health, Health::Failed, "{status:?}");
    let connection = &status
        .detail
        .iter()
        .find(|(k, _)| k == "connection")
        .unwrap()
        .1;
    assert!(connection.starts_with("down ("), "{connection}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reconnects_to_a_restarted_server() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let memory = Arc::new(MemoryDevice::new(SIZE));
    let mut brick = Brick::start(memory.clone(), &socket, Limits::default());
    let remote = Arc::new(
        RemoteDevice::connect(uri(&socket), options(Duration::from_secs(5)))
            .await
            .unwrap(),
    );
    let before = pattern(5, 8192);
    remote
        .write(0, before.clone(), WriteFlags::default())
        .await
        .unwrap();
    brick.kill();
    // A request made while the brick is down waits for it within its timeout.
    let waiting = tokio::spawn({
        let remote = remote.clone();
        async move { remote.read(0, 8192).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    let _brick = Brick::start(memory.clone(), &socket, Limits::default());
    assert_eq!(&waiting.await.unwrap().unwrap()[..], &before[..]);
    let after = pattern(6, 4096);
    remote
        .write(65536, after.clone(), WriteFlags { fua: true })
        .await
        .unwrap();
    assert_eq!(&memory.read(65536, 4096).await.unwrap()[..], &after[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_after_a_reconnect_fails_if_acknowledged_writes_were_not_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let memory = Arc::new(MemoryDevice::new(SIZE));
    let mut brick = Brick::start(memory.clone(), &socket, Limits::default());
    let remote = RemoteDevice::connect(uri(&socket), options(Duration::from_secs(5)))
        .await
        .unwrap();
    // Written and flushed, then the brick restarts: nothing acknowledged is at risk.
    remote
        .write(0, pattern(1, 4096), WriteFlags::default())
        .await
        .unwrap();
    remote.flush().await.unwrap();
    brick.kill();
    brick = Brick::start(memory.clone(), &socket, Limits::default());
    remote.read(0, 4096).await.unwrap();
    remote.flush().await.unwrap();
    // Written, acknowledged, not flushed, then the brick restarts (a real one may have
    // dropped the write from its cache): the next flush must not report it durable.
    remote
        .write(4096, pattern(2, 4096), WriteFlags::default())
        .await
        .unwrap();
    brick.kill();
    let _brick = Brick::start(memory.clone(), &socket, Limits::default());
    let err = remote.flush().await.unwrap_err();
    assert_eq!(err.errno(), strata_core::errno::EIO, "{err}");
    let why = format!("{err:?}");
    assert!(why.contains("acknowledged but not flushed"), "{why}");
    // Reported once: later flushes cover what is written from now on.
    remote.flush().await.unwrap();
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let socket = fake_server::start(dir.path(), FLAG_HAS_FLAGS, |_| None);
    let timeout = Duration::from_millis(300);
    let device = RemoteDevice::connect(uri(&socket), options(timeout))
        .await
        .unwrap();
    let started = Instant::now();
    let err = device.read(0, 4096).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed >= timeout && elapsed < timeout * 3, "{elapsed:?}");
    assert!(err.to_string().contains("no answer within 300ms"), "{err}");
    assert_eq!(err.errno(), strata_core::errno::EIO);
}

#[tokio::test]
async fn a_reply_with_a_wrong_magic_drops_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = fake_server::start(dir.path(), FLAG_HAS_FLAGS, |r| {
        let mut answer = fake_server::simple_reply(0, r.handle);
        answer[0] ^= 0xff;
        Some(answer)
    });
    let client = Client::connect(uri(&socket), options(Duration::from_millis(300)))
        .await
        .unwrap();
    let err = client.read(0, 512).await.unwrap_err();
    assert!(err.to_string().contains("reply magic"), "{err}");
    // Each connection was dropped at its bad reply and another one made.
    assert!(fake_server::accepted(&socket) >= 2);
}

#[tokio::test]
async fn a_reply_for_an_unknown_handle_drops_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let socket = fake_server::start(dir.path(), FLAG_HAS_FLAGS, |r| {
        Some(fake_server::simple_reply(0, r.handle + 1000))
    });
    let client = Client::connect(uri(&socket), options(Duration::from_millis(300)))
        .await
        .unwrap();
    let err = client.read(0, 512).await.unwrap_err().to_string();
    assert!(err.contains("which no request has"), "{err}");
    assert!(fake_server::accepted(&socket) >= 2);
}

/// Reads of [0, 8 KiB) are answered as a hole over the first 4 KiB and 0x77 bytes over the
/// second, in that order reversed; anything else with an error chunk carrying ENOSPC.
fn holes_and_errors(r: &Request) -> Option<Vec<u8>> {
    if r.kind != CMD_READ {
        let mut payload = 28u32.to_be_bytes().to_vec();
        payload.extend(5u16.to_be_bytes());
        payload.extend(b"full!");
        return Some(fake_server::chunk(
            REPLY_FLAG_DONE,
            REPLY_TYPE_ERROR,
            r.handle,
            &payload,
        ));
    }
    let mut data = (r.offset + 4096).to_be_bytes().to_vec();
    data.extend(std::iter::repeat_n(0x77, 4096));
    let mut hole = r.offset.to_be_bytes().to_vec();
    hole.extend(4096u32.to_be_bytes());
    let mut answer = fake_server::chunk(0, REPLY_TYPE_OFFSET_DATA, r.handle, &data);
    answer.extend(fake_server::chunk(
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_HOLE,
        r.handle,
        &hole,
    ));
    Some(answer)
}

#[tokio::test]
async fn structured_replies_holes_read_as_zeros_and_error_chunks_carry_their_errno() {
    let dir = tempfile::tempdir().unwrap();
    let flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH;
    let socket = fake_server::start_with(dir.path(), flags, true, holes_and_errors);
    let client = Client::connect(uri(&socket), options(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(client.info().structured_replies);
    let back = client.read(0, 8192).await.unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0));
    assert!(back[4096..].iter().all(|&b| b == 0x77));
    match client.flush().await {
        Err(ClientError::Remote { errno: 28, message }) => assert_eq!(message, "full!"),
        other => panic!("{other:?}"),
    }
    // A reply that leaves part of the read uncovered is an error, not zeros; at once, for
    // sending it again would get the same answer.
    let started = Instant::now();
    let err = client.read(0, 16384).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(err.to_string().contains("covered 8192 of 16384"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brick_that_comes_back_with_another_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let mut brick = Brick::start(
        Arc::new(MemoryDevice::new(SIZE)),
        &socket,
        Limits::default(),
    );
    let remote = RemoteDevice::connect(uri(&socket), options(Duration::from_millis(500)))
        .await
        .unwrap();
    brick.kill();
    let _brick = Brick::start(
        Arc::new(MemoryDevice::new(SIZE * 2)),
        &socket,
        Limits::default(),
    );
    let err = remote.read(0, 4096).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("size changed from 4194304 to 8388608"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_connections_share_the_requests_when_the_server_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    let memory = Arc::new(MemoryDevice::new(SIZE));
    let brick = Brick::start(memory.clone(), &socket_in(&dir), Limits::default());
    let mut four = options(Duration::from_secs(5));
    four.connections = 4;
    let client = Arc::new(Client::connect(uri(&socket_in(&dir)), four).await.unwrap());
    assert!(client.info().has(FLAG_CAN_MULTI_CONN));
    assert_eq!(client.connections(), 4);
    assert_eq!(brick.server.connections_total(), 4);
    let writes = (0..32u64).map(|i| {
        let client = client.clone();
        async move { client.write(i * 4096, pattern(i as u8, 4096), false).await }
    });
    futures_util::future::try_join_all(writes).await.unwrap();
    client.flush().await.unwrap();
    for i in 0..32u64 {
        let back = memory.read(i * 4096, 4096).await.unwrap();
        assert_eq!(&back[..], &pattern(i as u8, 4096)[..]);
    }
    // Still four: the requests went round them, none opened more.
    assert_eq!(brick.server.connections_total(), 4);
}

#[tokio::test]
async fn without_multi_conn_one_connection_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let socket = fake_server::start(dir.path(), FLAG_HAS_FLAGS | FLAG_SEND_FLUSH, |r| {
        Some(fake_server::simple_reply(0, r.handle))
    });
    let mut four = options(Duration::from_secs(5));
    four.connections = 4;
    let client = Client::connect(uri(&socket), four).await.unwrap();
    assert_eq!(client.connections(), 1);
    client.flush().await.unwrap();
    assert_eq!(fake_server::accepted(&socket), 1);
}
