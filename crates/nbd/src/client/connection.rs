//! One connection in the transmission phase: many requests in flight, a writer task that
//! sends them in order, a reader task that hands each reply to the request with its handle.
//!
//! A request only queues its frame and waits, so a request the caller gives up on (a
//! timeout) never leaves half a frame on the wire; its reply, when it comes, is dropped.
//! When either task fails, every waiting request gets the reason, and no new one is taken.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::warn;

use super::handshake::ExportInfo;
use super::ClientError;
use crate::proto::*;

/// One request as the caller hands it over.
#[derive(Clone, Debug)]
pub struct Command {
    pub kind: u16,
    pub flags: u16,
    pub offset: u64,
    pub length: u32,
    /// A WRITE's data.
    pub payload: Option<Bytes>,
}

/// What a request ends with: a READ's data, or nothing.
pub type Outcome = Result<Option<BytesMut>, ClientError>;

/// The longest message an error chunk may carry, and the error chunk's fixed part.
const MAX_ERROR_CHUNK: u32 = 4 + 2 + MAX_STRING_LEN as u32 + 8;

struct Waiter {
    kind: u16,
    offset: u64,
    length: u32,
    /// A READ's buffer: its length is how far it is filled (chunks in order append without
    /// zeroing first; a chunk past the end zero-fills the gap; the end is zero-filled).
    data: Option<BytesMut>,
    /// Bytes of a READ covered by data and hole chunks so far.
    covered: u64,
    /// The first error chunk.
    error: Option<ClientError>,
    reply: oneshot::Sender<Outcome>,
}

#[derive(Default)]
struct Table {
    waiters: HashMap<u64, Waiter>,
    /// Why the connection ended, once it has.
    closed: Option<String>,
}

struct Shared {
    table: Mutex<Table>,
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the connection: every waiting request gets `why`, later ones are refused.
    fn fail(&self, why: String) {
        let waiters = {
            let mut table = self.table();
            if table.closed.is_none() {
                table.closed = Some(why.clone());
            }
            std::mem::take(&mut table.waiters)
        };
        for (_, waiter) in waiters {
            let _ = waiter
                .reply
                .send(Err(ClientError::Disconnected(why.clone())));
        }
    }

    fn take(&self, handle: u64) -> Result<Waiter, ClientError> {
        self.table().waiters.remove(&handle).ok_or_else(|| {
            ClientError::Protocol(format!(
                "a reply for handle {handle:#x}, which no request has"
            ))
        })
    }

    fn put_back(&self, handle: u64, waiter: Waiter) {
        self.table().waiters.insert(handle, waiter);
    }
}

struct Frame {
    header: [u8; REQUEST_HEADER_LEN],
    payload: Option<Bytes>,
}

pub struct Connection {
    pub info: ExportInfo,
    shared: Arc<Shared>,
    frames: mpsc::UnboundedSender<Frame>,
    next_handle: AtomicU64,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for Connection {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Connection {
    /// Starts the reader and writer tasks on a stream past its handshake. `peer` names the
    /// server in log lines.
    pub fn start<R, W>(reader: R, writer: W, info: ExportInfo, peer: String) -> Connection
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
        });
        let (frames, queue) = mpsc::unbounded_channel();
        let reading = tokio::spawn(read_replies(reader, shared.clone(), info, peer.clone()));
        let writing = tokio::spawn(write_frames(writer, queue, shared.clone(), peer));
        Connection {
            info,
            shared,
            frames,
            next_handle: AtomicU64::new(1),
            tasks: [reading, writing],
        }
    }

    /// Why the connection ended, or `None` while it serves.
    pub fn closed(&self) -> Option<String> {
        self.shared.table().closed.clone()
    }

    /// Sends `command` and waits for its reply.
    pub async fn submit(&self, command: Command) -> Outcome {
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        {
            let mut table = self.shared.table();
            if let Some(why) = &table.closed {
                return Err(ClientError::Disconnected(why.clone()));
            }
            let data = (command.kind == CMD_READ)
                .then(|| BytesMut::with_capacity(command.length as usize));
            table.waiters.insert(
                handle,
                Waiter {
                    kind: command.kind,
                    offset: command.offset,
                    length: command.length,
                    data,
                    covered: 0,
                    error: None,
                    reply,
                },
            );
        }
        let mut header = BytesMut::with_capacity(REQUEST_HEADER_LEN);
        Request {
            flags: command.flags,
            kind: command.kind,
            handle,
            offset: command.offset,
            length: command.length,
        }
        .encode(&mut header);
        let frame = Frame {
            header: header[..].try_into().expect("a request header"),
            payload: command.payload,
        };
        if self.frames.send(frame).is_err() {
            self.shared
                .fail("the connection's writer has stopped".into());
        }
        match answer.await {
            Ok(outcome) => outcome,
            Err(_) => Err(ClientError::Disconnected(
                "the connection was dropped".into(),
            )),
        }
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(
    writer: W,
    mut queue: mpsc::UnboundedReceiver<Frame>,
    shared: Arc<Shared>,
    peer: String,
) {
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    let sent: std::io::Result<()> = async {
        while let Some(mut frame) = queue.recv().await {
            // Everything already queued goes out before one flush.
            loop {
                writer.write_all(&frame.header).await?;
                if let Some(payload) = &frame.payload {
                    writer.write_all(payload).await?;
                }
                match queue.try_recv() {
                    Ok(next) => frame = next,
                    Err(_) => break,
                }
            }
            writer.flush().await?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = sent {
        warn!(%peer, "nbd client: sending to the server failed: {e}");
        shared.fail(format!("sending to {peer} failed: {e}"));
    }
}

async fn read_replies<R: AsyncRead + Unpin>(
    reader: R,
    shared: Arc<Shared>,
    info: ExportInfo,
    peer: String,
) {
    // Reply headers are read field by field: buffered, a burst of replies costs one read
    // call, not six per reply. Large payloads bypass the buffer.
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let why = read_loop(&mut reader, &shared, &info).await;
    match &why {
        ClientError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            warn!(%peer, "nbd client: the server closed the connection")
        }
        why => warn!(%peer, "nbd client: dropping the connection: {why}"),
    }
    shared.fail(format!("connection to {peer} lost: {why}"));
}

/// Reads replies until the stream fails or misbehaves; returns why it stopped.
async fn read_loop<R: AsyncRead + Unpin>(
    reader: &mut R,
    shared: &Shared,
    info: &ExportInfo,
) -> ClientError {
    loop {
        let step = async {
            match reader.read_u32().await? {
                SIMPLE_REPLY_MAGIC => simple_reply(reader, shared).await,
                STRUCTURED_REPLY_MAGIC if info.structured_replies => chunk(reader, shared).await,
                STRUCTURED_REPLY_MAGIC => Err(ClientError::Protocol(
                    "a structured reply, which we did not negotiate".into(),
                )),
                other => Err(ClientError::Protocol(format!(
                    "reply magic {other:#010x} is neither a simple nor a structured reply"
                ))),
            }
        };
        if let Err(e) = step.await {
            return e;
        }
    }
}

async fn simple_reply<R: AsyncRead + Unpin>(
    reader: &mut R,
    shared: &Shared,
) -> Result<(), ClientError> {
    let error = reader.read_u32().await?;
    let handle = reader.read_u64().await?;
    let mut waiter = shared.take(handle)?;
    let outcome = if error != 0 {
        Err(ClientError::Remote {
            errno: error,
            message: String::new(),
        })
    } else if let Some(mut data) = waiter.data.take() {
        let length = waiter.length as usize;
        fill(reader, &mut data, length).await?;
        Ok(Some(data))
    } else {
        Ok(None)
    };
    let _ = waiter.reply.send(outcome);
    Ok(())
}

async fn chunk<R: AsyncRead + Unpin>(reader: &mut R, shared: &Shared) -> Result<(), ClientError> {
    let flags = reader.read_u16().await?;
    let kind = reader.read_u16().await?;
    let handle = reader.read_u64().await?;
    let length = reader.read_u32().await?;
    let mut waiter = shared.take(handle)?;
    // Out of the table while its chunk is read, the waiter would miss the connection's
    // failure; so a chunk that fails answers it here.
    match read_chunk(reader, &mut waiter, kind, length).await {
        Ok(()) => {}
        Err(e) => {
            let _ = waiter
                .reply
                .send(Err(ClientError::Disconnected(e.to_string())));
            return Err(e);
        }
    }
    if flags & REPLY_FLAG_DONE == 0 {
        shared.put_back(handle, waiter);
        return Ok(());
    }
    let outcome = match (waiter.error.take(), waiter.data.take()) {
        (Some(error), _) => Err(error),
        (None, Some(_)) if waiter.covered != u64::from(waiter.length) => {
            Err(ClientError::Protocol(format!(
                "the read reply covered {} of {} bytes",
                waiter.covered, waiter.length
            )))
        }
        (None, Some(mut data)) => {
            // Holes at the end were never written.
            data.resize(waiter.length as usize, 0);
            Ok(Some(data))
        }
        (None, None) => Ok(None),
    };
    let _ = waiter.reply.send(outcome);
    Ok(())
}

/// Reads `count` bytes from `reader` onto the end of `data`, into its spare capacity (no
/// zeroing first: a 1 MiB read would otherwise clear a megabyte only to overwrite it).
async fn fill<R: AsyncRead + Unpin>(
    reader: &mut R,
    data: &mut BytesMut,
    count: usize,
) -> std::io::Result<()> {
    let target = data.len() + count;
    data.reserve(count);
    while data.len() < target {
        let missing = target - data.len();
        let mut room = (&mut *data).limit(missing);
        if reader.read_buf(&mut room).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// Reads one chunk's payload into its waiter.
async fn read_chunk<R: AsyncRead + Unpin>(
    reader: &mut R,
    waiter: &mut Waiter,
    kind: u16,
    length: u32,
) -> Result<(), ClientError> {
    let bad = |why: String| Err(ClientError::Protocol(why));
    match kind {
        REPLY_TYPE_NONE if length == 0 => Ok(()),
        REPLY_TYPE_NONE => bad(format!("a NONE chunk of {length} bytes")),
        REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE => {
            if waiter.kind != CMD_READ {
                return bad(format!("a data chunk for command {}", waiter.kind));
            }
            let (span, fixed) = if kind == REPLY_TYPE_OFFSET_DATA {
                if length <= 8 {
                    return bad(format!("a data chunk of {length} bytes"));
                }
                (length - 8, 8)
            } else {
                if length != 12 {
                    return bad(format!("a hole chunk of {length} bytes"));
                }
                (0, 12)
            };
            let offset = reader.read_u64().await?;
            let span = if fixed == 12 {
                reader.read_u32().await?
            } else {
                span
            };
            let start = offset.checked_sub(waiter.offset);
            let inside = start.filter(|s| s + u64::from(span) <= u64::from(waiter.length));
            let Some(start) = inside else {
                return bad(format!(
                    "a chunk for [{offset}, +{span}) outside the request [{}, +{})",
                    waiter.offset, waiter.length
                ));
            };
            let data = waiter.data.as_mut().expect("a read has a buffer");
            let range = start as usize..start as usize + span as usize;
            if kind == REPLY_TYPE_OFFSET_DATA && range.start == data.len() {
                fill(reader, data, span as usize).await?;
            } else {
                // Out of order (or a hole): zero up to the chunk's end, then overwrite.
                if data.len() < range.end {
                    data.resize(range.end, 0);
                }
                if kind == REPLY_TYPE_OFFSET_DATA {
                    reader.read_exact(&mut data[range]).await?;
                } else {
                    data[range].fill(0);
                }
            }
            waiter.covered += u64::from(span);
            Ok(())
        }
        kind if kind & (1 << 15) != 0 => {
            if !(6..=MAX_ERROR_CHUNK).contains(&length) {
                return bad(format!("an error chunk of {length} bytes"));
            }
            let mut payload = vec![0; length as usize];
            reader.read_exact(&mut payload).await?;
            let errno = u32::from_be_bytes(payload[0..4].try_into().unwrap());
            let message_len = u16::from_be_bytes([payload[4], payload[5]]) as usize;
            let Some(message) = payload.get(6..6 + message_len) else {
                return bad(format!(
                    "an error message of {message_len} bytes in a {length}-byte chunk"
                ));
            };
            if errno == 0 {
                return bad("an error chunk with error 0".into());
            }
            if waiter.error.is_none() {
                waiter.error = Some(ClientError::Remote {
                    errno,
                    message: String::from_utf8_lossy(message).into_owned(),
                });
            }
            Ok(())
        }
        other => bad(format!("chunk type {other}, which we do not know")),
    }
}
