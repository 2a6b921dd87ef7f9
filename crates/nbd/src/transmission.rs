//! The transmission phase: many requests in flight per connection, replies out of order.
//!
//! Per connection, one task reads requests, one runs them against the device concurrently,
//! one writes replies; see [`serve`]. Memory is bounded per connection: a request takes a slot (at most
//! `Limits::max_in_flight`) and, if it carries or asks for data, a share of the byte budget
//! (`Limits::max_buffered_bytes`) *before* any buffer is allocated; both are released only when
//! its reply has been written to the socket. A client that stops reading replies therefore
//! stops the server from reading its requests, and nothing grows without bound.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt};
use strata_core::{
    errno, BlockError, Control, ControlReply, DeviceRef, ExtentState, WriteFlags, ZeroFlags,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::handshake::Negotiated;
use crate::proto::*;
use crate::Limits;

/// Bytes of the per-connection budget one permit stands for.
const BUDGET_UNIT: u64 = 4096;

/// Why a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// NBD_CMD_DISC, or the client closed its side between requests.
    ClientDone,
    /// The server is shutting down.
    Shutdown,
    /// The client broke the protocol or vanished mid-request; logged, connection dropped.
    Dropped(String),
}

struct Session {
    negotiated: Negotiated,
    limits: Limits,
    /// The export's device as this connection sees it: its own view where the device keeps
    /// one per opener (`Control::Connection`), else the device itself.
    device: DeviceRef,
}

/// The device one connection to `export` reads and writes.
async fn connection_view(export: &DeviceRef) -> DeviceRef {
    match export.control(Control::Connection).await {
        Ok(ControlReply::Device(view)) => view,
        _ => export.clone(),
    }
}

struct Reply {
    handle: u64,
    body: ReplyBody,
    // Held until the reply is on the wire: this is the backpressure.
    _slot: OwnedSemaphorePermit,
    _budget: Option<OwnedSemaphorePermit>,
}

enum ReplyBody {
    Done,
    Data { offset: u64, data: Bytes },
    BlockStatus(Vec<(u32, u32)>),
    Error { errno: u32, message: String },
}

impl ReplyBody {
    fn error(errno: u32, message: impl Into<String>) -> Self {
        ReplyBody::Error {
            errno,
            message: message.into(),
        }
    }
}

/// A request taken off the wire, with the permits that bound it.
struct Accepted {
    request: Request,
    payload: Option<Bytes>,
    slot: OwnedSemaphorePermit,
    budget: Option<OwnedSemaphorePermit>,
}

/// Serves requests until the client disconnects or `shutdown` turns true; then answers the
/// requests already accepted.
///
/// The reader and the writer are tasks of their own; the requests run concurrently in the
/// caller's task. A connection's receive copies, device work and send copies thus overlap on
/// different cores, and under load the hand-offs between them cost nothing: a channel wakes a
/// task only when it is waiting. One task per request measured slower (bench/): its
/// wake-ups, not the I/O, bounded 4 KiB IOPS.
pub async fn serve<R, W>(
    reader: R,
    writer: W,
    negotiated: Negotiated,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) -> SessionEnd
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    assert!(limits.max_payload as u64 <= limits.max_buffered_bytes);
    assert!(limits.max_in_flight > 0);
    let device = connection_view(&negotiated.export.device).await;
    let session = Arc::new(Session {
        negotiated,
        limits,
        device,
    });
    // Unbounded in type only: every queued request and reply holds a slot, so neither queue
    // exceeds max_in_flight entries.
    let (accepted, to_run) = mpsc::unbounded_channel();
    let (replies, to_write) = mpsc::unbounded_channel();
    let structured = session.negotiated.structured_replies;
    let reading = tokio::spawn(read_requests(session.clone(), reader, accepted, shutdown));
    let writing = tokio::spawn(write_replies(writer, to_write, structured));
    run_requests(&session, to_run, replies).await;
    if let Err(e) = writing.await {
        warn!("reply writer failed: {e}");
    }
    match reading.await {
        Ok(end) => end,
        Err(e) => SessionEnd::Dropped(format!("request reader failed: {e}")),
    }
}

/// Reads requests until the session ends, taking each one's permits before its buffer.
async fn read_requests<R: AsyncRead + Unpin>(
    session: Arc<Session>,
    reader: R,
    accepted: mpsc::UnboundedSender<Accepted>,
    mut shutdown: watch::Receiver<bool>,
) -> SessionEnd {
    let limits = &session.limits;
    let slots = Arc::new(Semaphore::new(limits.max_in_flight as usize));
    let budget_units = (limits.max_buffered_bytes / BUDGET_UNIT) as usize;
    let budget = Arc::new(Semaphore::new(budget_units));
    let mut reader = BufReader::with_capacity(128 * 1024, reader);
    loop {
        let mut header = [0u8; REQUEST_HEADER_LEN];
        let read = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => return SessionEnd::Shutdown,
            read = read_header(&mut reader, &mut header) => read,
        };
        match read {
            Ok(true) => {}
            Ok(false) => return SessionEnd::ClientDone,
            Err(e) => return SessionEnd::Dropped(format!("reading a request: {e}")),
        }
        let request = match Request::parse(&header) {
            Ok(request) => request,
            Err(magic) => return SessionEnd::Dropped(format!("bad request magic {magic:#x}")),
        };
        if request.kind == CMD_DISC {
            return SessionEnd::ClientDone;
        }
        let slot = acquire(&slots, 1).await;
        match accept(&session, &mut reader, request, slot, &budget).await {
            Ok(next) => {
                // The runner outlives the reader, so the queue is open.
                let _ = accepted.send(next);
            }
            Err(end) => return end,
        }
    }
}

/// Runs accepted requests concurrently and queues their replies as they complete.
async fn run_requests(
    session: &Session,
    mut to_run: mpsc::UnboundedReceiver<Accepted>,
    replies: mpsc::UnboundedSender<Reply>,
) {
    let mut running = FuturesUnordered::new();
    let mut reading = true;
    loop {
        tokio::select! {
            next = to_run.recv(), if reading => match next {
                Some(accepted) => running.push(run(session, accepted)),
                None => reading = false,
            },
            Some(reply) = running.next(), if !running.is_empty() => {
                // The writer drains its queue to the end, so the queue is open.
                let _ = replies.send(reply);
            }
            else => break,
        }
    }
}

async fn run(session: &Session, accepted: Accepted) -> Reply {
    let Accepted {
        request,
        payload,
        slot,
        budget,
    } = accepted;
    let body = execute(session, request, payload).await;
    Reply {
        handle: request.handle,
        body,
        _slot: slot,
        _budget: budget,
    }
}

async fn acquire(semaphore: &Arc<Semaphore>, permits: u32) -> OwnedSemaphorePermit {
    semaphore
        .clone()
        .acquire_many_owned(permits)
        .await
        .expect("connection semaphores are never closed")
}

/// Reads a header; `Ok(false)` on a clean end of stream between requests.
async fn read_header<R: AsyncRead + Unpin>(
    reader: &mut R,
    header: &mut [u8; REQUEST_HEADER_LEN],
) -> std::io::Result<bool> {
    let first = reader.read(&mut header[..]).await?;
    if first == 0 {
        return Ok(false);
    }
    reader.read_exact(&mut header[first..]).await?;
    Ok(true)
}

/// Takes one request's payload off the wire, or refuses it on the spot.
async fn accept<R: AsyncRead + Unpin>(
    session: &Session,
    reader: &mut R,
    request: Request,
    slot: OwnedSemaphorePermit,
    budget: &Arc<Semaphore>,
) -> Result<Accepted, SessionEnd> {
    let carries_data = matches!(request.kind, CMD_READ | CMD_WRITE);
    let length = u64::from(request.length);
    if carries_data && request.length > session.limits.max_payload {
        // Refused before any buffer exists. A write's payload is still on the wire and must
        // be skipped to find the next request.
        if request.kind == CMD_WRITE {
            skip(reader, length)
                .await
                .map_err(|e| SessionEnd::Dropped(format!("skipping an oversize write: {e}")))?;
        }
        warn!(
            handle = request.handle,
            "request of {length} bytes exceeds the maximum payload of {}",
            session.limits.max_payload
        );
        // Turned into EINVAL by `validate`, which sees the same excess.
        return Ok(Accepted {
            request,
            payload: None,
            slot,
            budget: None,
        });
    }
    let budget = if carries_data && length > 0 {
        let units = length.div_ceil(BUDGET_UNIT) as u32;
        Some(acquire(budget, units).await)
    } else {
        None
    };
    let payload = if request.kind == CMD_WRITE {
        let data = read_payload(reader, request.length as usize)
            .await
            .map_err(|e| {
                SessionEnd::Dropped(format!(
                    "client vanished in the middle of a {length}-byte write: {e}"
                ))
            })?;
        Some(data)
    } else {
        None
    };
    Ok(Accepted {
        request,
        payload,
        slot,
        budget,
    })
}

/// Reads exactly `length` bytes into a fresh buffer without zeroing it first (`read_buf`
/// fills spare capacity; zeroing 1 MiB payloads measured ~10% of a sequential write's CPU).
async fn read_payload<R: AsyncRead + Unpin>(
    reader: &mut R,
    length: usize,
) -> std::io::Result<Bytes> {
    use bytes::BufMut;
    let mut data = BytesMut::with_capacity(length);
    while data.len() < length {
        let wanted = length - data.len();
        // `limit` keeps the read inside this payload: the next request's bytes stay queued.
        if reader.read_buf(&mut (&mut data).limit(wanted)).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    debug_assert_eq!(data.len(), length);
    Ok(data.freeze())
}

async fn skip<R: AsyncRead + Unpin>(reader: &mut R, mut length: u64) -> std::io::Result<()> {
    let mut scratch = [0u8; 8192];
    while length > 0 {
        let chunk = length.min(scratch.len() as u64) as usize;
        reader.read_exact(&mut scratch[..chunk]).await?;
        length -= chunk as u64;
    }
    Ok(())
}

/// Flags each command accepts; anything else is EINVAL (spec: "Error values"). FUA is
/// accepted on every command, as the spec requires once SEND_FUA is advertised ("even by
/// ignoring the bit"); it only means something on commands that write.
fn allowed_flags(kind: u16, structured: bool) -> Option<u16> {
    let specific = match kind {
        CMD_READ if structured => CMD_FLAG_DF,
        CMD_READ | CMD_FLUSH | CMD_CACHE | CMD_WRITE | CMD_TRIM => 0,
        CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        _ => return None,
    };
    Some(specific | CMD_FLAG_FUA)
}

/// Checks a request against the export before it reaches the device, so each failure gets
/// the errno the spec asks for.
fn validate(session: &Session, request: &Request) -> Result<(), ReplyBody> {
    let negotiated = &session.negotiated;
    let Some(allowed) = allowed_flags(request.kind, negotiated.structured_replies) else {
        return Err(ReplyBody::error(
            errno::EINVAL,
            format!("unknown command {}", request.kind),
        ));
    };
    if request.flags & !allowed != 0 {
        return Err(ReplyBody::error(
            errno::EINVAL,
            format!(
                "flags {:#x} not valid for command {}",
                request.flags, request.kind
            ),
        ));
    }
    let writes = matches!(request.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && negotiated.transmission_flags & FLAG_READ_ONLY != 0 {
        return Err(ReplyBody::error(errno::EPERM, "export is read-only"));
    }
    if request.kind == CMD_BLOCK_STATUS && !negotiated.base_allocation {
        return Err(ReplyBody::error(
            errno::EINVAL,
            "no metadata context was negotiated",
        ));
    }
    let carries_data = matches!(request.kind, CMD_READ | CMD_WRITE);
    if carries_data && request.length > session.limits.max_payload {
        return Err(ReplyBody::error(
            errno::EINVAL,
            format!(
                "request of {} bytes exceeds the maximum payload of {}",
                request.length, session.limits.max_payload
            ),
        ));
    }
    if request.kind == CMD_FLUSH {
        return Ok(());
    }
    let geometry = negotiated.export.device.geometry();
    let end = request.offset.checked_add(u64::from(request.length));
    if end.is_none_or(|end| end > geometry.size) {
        let code = match request.kind {
            CMD_WRITE | CMD_WRITE_ZEROES => errno::ENOSPC,
            _ => errno::EINVAL,
        };
        return Err(ReplyBody::error(
            code,
            format!(
                "[{}, +{}) reaches past the end of the export ({} bytes)",
                request.offset, request.length, geometry.size
            ),
        ));
    }
    let align = u64::from(geometry.min_io);
    let checks_alignment = request.kind != CMD_BLOCK_STATUS && request.kind != CMD_CACHE;
    if checks_alignment
        && (!request.offset.is_multiple_of(align)
            || !u64::from(request.length).is_multiple_of(align))
    {
        return Err(ReplyBody::error(
            errno::EINVAL,
            format!("request is not aligned to the minimum block size {align}"),
        ));
    }
    Ok(())
}

async fn execute(session: &Session, request: Request, payload: Option<Bytes>) -> ReplyBody {
    if let Err(refusal) = validate(session, &request) {
        if let ReplyBody::Error { errno, message } = &refusal {
            debug!(handle = request.handle, errno, "{message}");
        }
        return refusal;
    }
    let device = &session.device;
    let offset = request.offset;
    let length = u64::from(request.length);
    let fua = request.flags & CMD_FLAG_FUA != 0;
    if length == 0 && request.kind != CMD_FLUSH {
        return ReplyBody::Done;
    }
    let result = match request.kind {
        CMD_READ => match device.read(offset, request.length as usize).await {
            Ok(data) => {
                let data = data.freeze();
                return ReplyBody::Data { offset, data };
            }
            Err(e) => Err(e),
        },
        CMD_WRITE => {
            let data = payload.expect("a write always carries its payload");
            device.write(offset, data, WriteFlags { fua }).await
        }
        CMD_FLUSH => device.flush().await,
        CMD_TRIM => match device.discard(offset, length).await {
            Ok(()) if fua => device.flush().await,
            other => other,
        },
        CMD_WRITE_ZEROES => {
            let flags = ZeroFlags {
                may_trim: request.flags & CMD_FLAG_NO_HOLE == 0,
                fast: request.flags & CMD_FLAG_FAST_ZERO != 0,
                fua,
            };
            device.write_zeroes(offset, length, flags).await
        }
        // Our devices keep no cache that prefetching would fill.
        CMD_CACHE => Ok(()),
        CMD_BLOCK_STATUS => {
            let req_one = request.flags & CMD_FLAG_REQ_ONE != 0;
            return match device.block_status(offset, length).await {
                Ok(extents) => ReplyBody::BlockStatus(descriptors(&extents, req_one)),
                Err(e) => failure(&request, e),
            };
        }
        _ => unreachable!("validate refuses unknown commands"),
    };
    match result {
        Ok(()) => ReplyBody::Done,
        Err(e) => failure(&request, e),
    }
}

/// Upper bound on descriptors in one block-status reply (8 bytes each: 512 KiB).
const MAX_DESCRIPTORS: usize = 65536;

fn descriptors(extents: &[strata_core::Extent], req_one: bool) -> Vec<(u32, u32)> {
    let limit = if req_one { 1 } else { MAX_DESCRIPTORS };
    extents
        .iter()
        .take(limit)
        .map(|extent| {
            let flags = match extent.state {
                ExtentState::Data => 0,
                ExtentState::Zero => STATE_ZERO,
                ExtentState::Hole => STATE_HOLE | STATE_ZERO,
            };
            // Requests are at most u32::MAX long, and extents never exceed the request.
            (u32::try_from(extent.len).unwrap_or(u32::MAX), flags)
        })
        .collect()
}

fn failure(request: &Request, error: BlockError) -> ReplyBody {
    let code = error.errno();
    if code == errno::EIO {
        warn!(
            handle = request.handle,
            command = request.kind,
            offset = request.offset,
            length = request.length,
            "{error}"
        );
    } else {
        debug!(handle = request.handle, "{error}");
    }
    ReplyBody::error(code, error.to_string())
}

/// Writes replies in completion order, flushing the socket whenever the queue runs dry.
async fn write_replies<W: AsyncWrite + Unpin>(
    writer: W,
    mut queue: mpsc::UnboundedReceiver<Reply>,
    structured: bool,
) {
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    let mut header = BytesMut::with_capacity(64);
    let mut broken = false;
    while let Some(reply) = queue.recv().await {
        if broken {
            continue; // Keep draining so that request tasks release their permits.
        }
        header.clear();
        let payload = encode(&mut header, &reply, structured);
        let mut result = writer.write_all(&header).await;
        if let (Ok(()), Some(payload)) = (&result, payload) {
            result = writer.write_all(payload).await;
        }
        if result.is_ok() && queue.is_empty() {
            result = writer.flush().await;
        }
        if let Err(e) = result {
            debug!("client stopped taking replies: {e}");
            broken = true;
        }
    }
    let _ = writer.shutdown().await;
}

/// Encodes everything but a read's data into `out`; returns the data to send after it.
fn encode<'a>(out: &mut BytesMut, reply: &'a Reply, structured: bool) -> Option<&'a [u8]> {
    use bytes::BufMut;
    let handle = reply.handle;
    match (&reply.body, structured) {
        (ReplyBody::Done, false) => put_simple_reply(out, 0, handle),
        (ReplyBody::Data { data, .. }, false) => {
            put_simple_reply(out, 0, handle);
            return Some(data);
        }
        (ReplyBody::Error { errno, .. }, false) => put_simple_reply(out, *errno, handle),
        (ReplyBody::BlockStatus(_), false) => {
            unreachable!("block status is refused without structured replies")
        }
        (ReplyBody::Done, true) => {
            put_chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, handle, 0)
        }
        (ReplyBody::Data { offset, data }, true) => {
            let length = 8 + data.len() as u32;
            put_chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, handle, length);
            out.put_u64(*offset);
            return Some(data);
        }
        (ReplyBody::Error { errno, message }, true) => {
            put_error_chunk(out, handle, *errno, message)
        }
        (ReplyBody::BlockStatus(descriptors), true) => {
            let length = 4 + 8 * descriptors.len() as u32;
            put_chunk_header(
                out,
                REPLY_FLAG_DONE,
                REPLY_TYPE_BLOCK_STATUS,
                handle,
                length,
            );
            out.put_u32(BASE_ALLOCATION_ID);
            for (len, flags) in descriptors {
                out.put_u32(*len);
                out.put_u32(*flags);
            }
        }
    }
    None
}
