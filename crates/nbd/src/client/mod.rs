//! An NBD client: a remote export as a Strata device (a "brick").
//!
//! One [`Client`] keeps one connection to one export (or several, taken in turn, when the
//! server advertises multi-conn). Requests run concurrently on it; each has a deadline. A connection that fails fails everything in flight on it; the next request
//! reconnects (with exponential backoff between failed attempts), and a request that lost its
//! connection is sent again on the new one while its deadline lasts: every command we send
//! (READ, WRITE, FLUSH, TRIM, WRITE_ZEROES) has the same effect when repeated.
//!
//! An `nbds://` URI upgrades every connection with STARTTLS before any other option and
//! verifies the server's certificate (see [`crate::tls::ClientTls`]).

mod connection;
mod device;
mod handshake;
mod uri;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::try_join_all;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::Instant;
use tracing::{info, warn};

pub use connection::Command;
use connection::Connection;
pub use device::RemoteDevice;
pub use handshake::ExportInfo;
pub use uri::{Address, NbdUri, DEFAULT_PORT};

use crate::proto::*;
use crate::tls::ClientTls;
use crate::transport::Transport;

/// Why a client request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server broke the protocol; the connection was dropped.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server refused the export during the handshake.
    #[error("the server refused: {0}")]
    Refused(String),
    /// The connection ended while the request was in flight (or before it was sent).
    #[error("{0}")]
    Disconnected(String),
    /// The server answered the request with an error.
    #[error("the server answered errno {errno}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Remote { errno: u32, message: String },
    /// No answer within the request's timeout.
    #[error("{0}")]
    TimedOut(String),
    /// The server does not advertise this command or flag.
    #[error("the server does not support {0}")]
    Unsupported(&'static str),
}

/// How a [`Client`] behaves.
#[derive(Clone, Copy, Debug)]
pub struct ClientOptions {
    /// How long one request (with its retries after a reconnect) may take before it fails.
    pub timeout: Duration,
    /// The first pause after a failed connection attempt; it doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Connections to keep, requests spread over them in turn. More than one is made only
    /// when the server advertises CAN_MULTI_CONN (a FLUSH on one then covers writes on all).
    pub connections: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(30),
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            connections: 1,
        }
    }
}

/// A failed attempt at a request, and whether to make another.
enum Retry {
    Yes(ClientError),
    No(ClientError),
}

/// When the next connection attempt may run, after failed ones.
struct Backoff {
    pause: Duration,
    not_before: Option<Instant>,
}

/// The link's state, for status displays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkState {
    Connected,
    /// Down since the given failure; the next request reconnects.
    Down(String),
}

/// A client for one export. See the module documentation.
pub struct Client {
    uri: NbdUri,
    options: ClientOptions,
    /// How connections upgrade to TLS (`nbds://` URIs).
    tls: Option<ClientTls>,
    /// What the first connection found; later ones must agree on the size.
    info: ExportInfo,
    links: Vec<Link>,
    /// The link the next request goes on (modulo their number).
    turn: AtomicUsize,
    /// Changes the server acknowledged (writes, trims, zeroes without FUA)...
    acked: AtomicU64,
    /// ...of which a successful FLUSH covers this many.
    flushed: AtomicU64,
    /// A connection was lost with acknowledged changes not yet flushed: the server may have
    /// lost them (a restart drops its cache), so the next FLUSH must not report them durable.
    lost_unflushed: AtomicBool,
}

/// One connection slot: the connection, and the pacing of its reconnects.
struct Link {
    current: Mutex<Option<Arc<Connection>>>,
    /// Held by whoever is reconnecting, so that one attempt runs at a time.
    backoff: tokio::sync::Mutex<Backoff>,
}

impl Link {
    fn new(connection: Connection, options: &ClientOptions) -> Link {
        Link {
            current: Mutex::new(Some(Arc::new(connection))),
            backoff: tokio::sync::Mutex::new(Backoff {
                pause: options.initial_backoff,
                not_before: None,
            }),
        }
    }

    fn open_connection(&self) -> Option<Arc<Connection>> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().filter(|c| c.closed().is_none()).cloned()
    }

    fn closed(&self) -> Option<String> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().and_then(|c| c.closed())
    }
}

impl Client {
    /// Connects to `uri` (plaintext) and negotiates its export, within `options.timeout`.
    pub async fn connect(uri: NbdUri, options: ClientOptions) -> Result<Client, ClientError> {
        Client::connect_with(uri, options, None).await
    }

    /// Connects to `uri`, upgrading to TLS with `tls` (which an `nbds://` URI needs and a
    /// plaintext one must not have), and negotiates its export within `options.timeout`.
    pub async fn connect_with(
        uri: NbdUri,
        options: ClientOptions,
        tls: Option<ClientTls>,
    ) -> Result<Client, ClientError> {
        match (uri.tls, &tls) {
            (true, None) => {
                return Err(ClientError::Refused(format!(
                    "{uri}: an nbds:// URI needs TLS settings (the CA that signed the server's \
                     certificate)"
                )))
            }
            (false, Some(_)) => {
                return Err(ClientError::Refused(format!(
                    "{uri}: TLS settings given for a plaintext URI (write nbds:// to use TLS)"
                )))
            }
            _ => {}
        }
        let opening = async {
            let first = open(&uri, tls.as_ref()).await?;
            let info = first.info;
            let mut links = vec![Link::new(first, &options)];
            let wanted = options.connections.max(1);
            if wanted > 1 && !info.has(FLAG_CAN_MULTI_CONN) {
                warn!(%uri, "nbd client: the server does not advertise multi-conn: using one connection, not {wanted}");
            } else {
                for _ in 1..wanted {
                    links.push(Link::new(open(&uri, tls.as_ref()).await?, &options));
                }
            }
            Ok::<_, ClientError>((info, links))
        };
        let (info, links) = tokio::time::timeout(options.timeout, opening)
            .await
            .map_err(|_| {
                ClientError::TimedOut(format!(
                    "{uri}: no handshake within {}",
                    strata_core::duration::format_duration(options.timeout)
                ))
            })??;
        Ok(Client {
            info,
            uri,
            options,
            tls,
            links,
            turn: AtomicUsize::new(0),
            acked: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            lost_unflushed: AtomicBool::new(false),
        })
    }

    /// Connections in use (one unless the server allows several).
    pub fn connections(&self) -> usize {
        self.links.len()
    }

    pub fn uri(&self) -> &NbdUri {
        &self.uri
    }

    pub fn info(&self) -> ExportInfo {
        self.info
    }

    pub fn options(&self) -> ClientOptions {
        self.options
    }

    /// Connected when every connection is; else why the first one that is not went down.
    pub fn state(&self) -> LinkState {
        match self.links.iter().find_map(Link::closed) {
            None => LinkState::Connected,
            Some(why) => LinkState::Down(why),
        }
    }

    /// `link`'s live connection, reconnecting if it has none (after the backoff pause).
    async fn connection(&self, link: &Link) -> Result<Arc<Connection>, ClientError> {
        if let Some(connection) = link.open_connection() {
            return Ok(connection);
        }
        let mut backoff = link.backoff.lock().await;
        if let Some(connection) = link.open_connection() {
            return Ok(connection);
        }
        if let Some(at) = backoff.not_before {
            tokio::time::sleep_until(at).await;
        }
        let attempt = match open(&self.uri, self.tls.as_ref()).await {
            Ok(connection) if connection.info.size != self.info.size => {
                Err(ClientError::Protocol(format!(
                    "the export's size changed from {} to {} bytes",
                    self.info.size, connection.info.size
                )))
            }
            other => other,
        };
        match attempt {
            Ok(connection) => {
                info!(uri = %self.uri, "nbd client: reconnected");
                if self.acked.load(Ordering::SeqCst) > self.flushed.load(Ordering::SeqCst) {
                    self.lost_unflushed.store(true, Ordering::SeqCst);
                    warn!(uri = %self.uri, "nbd client: reconnected with acknowledged writes not yet flushed; the next flush fails");
                }
                backoff.pause = self.options.initial_backoff;
                backoff.not_before = None;
                let connection = Arc::new(connection);
                *link.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(connection.clone());
                Ok(connection)
            }
            Err(e) => {
                warn!(uri = %self.uri, "nbd client: reconnecting failed (next try in {:?}): {e}", backoff.pause);
                backoff.not_before = Some(Instant::now() + backoff.pause);
                backoff.pause = (backoff.pause * 2).min(self.options.max_backoff);
                Err(e)
            }
        }
    }

    /// Sends one command (already within the server's limits), reconnecting and resending it
    /// after a lost connection until its deadline.
    pub async fn call(&self, command: Command) -> Result<Option<BytesMut>, ClientError> {
        let changes = matches!(command.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES)
            && command.flags & CMD_FLAG_FUA == 0;
        let flush = command.kind == CMD_FLUSH;
        let covered = self.acked.load(Ordering::SeqCst);
        let answer = self.send(command).await?;
        if changes {
            self.acked.fetch_add(1, Ordering::SeqCst);
        } else if flush {
            if self.lost_unflushed.swap(false, Ordering::SeqCst) {
                return Err(ClientError::Disconnected(format!(
                    "{}: the connection was lost with writes acknowledged but not flushed; \
                     the server may have dropped them",
                    self.uri
                )));
            }
            self.flushed.fetch_max(covered, Ordering::SeqCst);
        }
        Ok(answer)
    }

    async fn send(&self, command: Command) -> Result<Option<BytesMut>, ClientError> {
        let deadline = Instant::now() + self.options.timeout;
        let mut lost: Option<String> = None;
        let timed_out = |lost: &Option<String>| {
            let mut why = format!(
                "{}: no answer within {}",
                self.uri,
                strata_core::duration::format_duration(self.options.timeout)
            );
            if let Some(lost) = lost {
                why.push_str(&format!(" (the last attempt failed: {lost})"));
            }
            ClientError::TimedOut(why)
        };
        loop {
            // Any failure to connect may pass (the server restarting); of a request's own
            // failures only a lost connection is worth sending it again for: an answer, even
            // a malformed one, would be the same again.
            // Round-robin; a request sent again may go on another link.
            let link = &self.links[self.turn.fetch_add(1, Ordering::Relaxed) % self.links.len()];
            let attempt = async {
                let connection = self.connection(link).await.map_err(Retry::Yes)?;
                connection
                    .submit(command.clone())
                    .await
                    .map_err(|e| match e {
                        e @ ClientError::Disconnected(_) => Retry::Yes(e),
                        e => Retry::No(e),
                    })
            };
            match tokio::time::timeout_at(deadline, attempt).await {
                Err(_) => return Err(timed_out(&lost)),
                Ok(Ok(data)) => return Ok(data),
                Ok(Err(Retry::Yes(e))) => {
                    lost = Some(e.to_string());
                }
                Ok(Err(Retry::No(e))) => return Err(e),
            }
        }
    }

    fn require(&self, flag: u16, what: &'static str) -> Result<(), ClientError> {
        if self.info.has(flag) {
            Ok(())
        } else {
            Err(ClientError::Unsupported(what))
        }
    }

    fn writable(&self) -> Result<(), ClientError> {
        if self.info.has(FLAG_READ_ONLY) {
            Err(ClientError::Remote {
                errno: strata_core::errno::EPERM,
                message: "the export is read-only".into(),
            })
        } else {
            Ok(())
        }
    }

    /// The largest READ or WRITE payload in one request.
    fn max_payload(&self) -> u64 {
        u64::from(self.info.max_block.max(self.info.min_block))
    }

    pub async fn read(&self, offset: u64, len: usize) -> Result<BytesMut, ClientError> {
        let pieces = split(offset, len as u64, self.max_payload());
        if pieces.len() == 1 {
            return self.read_piece(offset, len as u32).await;
        }
        let parts = try_join_all(pieces.into_iter().map(|(at, n)| self.read_piece(at, n))).await?;
        let mut out = BytesMut::with_capacity(len);
        for part in parts {
            out.extend_from_slice(&part);
        }
        Ok(out)
    }

    async fn read_piece(&self, offset: u64, length: u32) -> Result<BytesMut, ClientError> {
        let command = Command {
            kind: CMD_READ,
            flags: 0,
            offset,
            length,
            payload: None,
        };
        Ok(self.call(command).await?.unwrap_or_default())
    }

    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), ClientError> {
        self.writable()?;
        if fua {
            self.require(FLAG_SEND_FUA, "FUA")?;
        }
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        let pieces = split(offset, data.len() as u64, self.max_payload());
        try_join_all(pieces.into_iter().map(|(at, n)| {
            let start = (at - offset) as usize;
            let command = Command {
                kind: CMD_WRITE,
                flags,
                offset: at,
                length: n,
                payload: Some(data.slice(start..start + n as usize)),
            };
            self.call(command)
        }))
        .await?;
        Ok(())
    }

    pub async fn flush(&self) -> Result<(), ClientError> {
        self.require(FLAG_SEND_FLUSH, "FLUSH")?;
        self.call(Command {
            kind: CMD_FLUSH,
            flags: 0,
            offset: 0,
            length: 0,
            payload: None,
        })
        .await?;
        Ok(())
    }

    pub async fn trim(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        self.writable()?;
        self.require(FLAG_SEND_TRIM, "TRIM")?;
        self.ranged(CMD_TRIM, 0, offset, len).await
    }

    /// WRITE_ZEROES; `may_trim` leaves NO_HOLE off, `fast` sets FAST_ZERO.
    pub async fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fast: bool,
        fua: bool,
    ) -> Result<(), ClientError> {
        self.writable()?;
        self.require(FLAG_SEND_WRITE_ZEROES, "WRITE_ZEROES")?;
        let mut flags = 0;
        if !may_trim {
            flags |= CMD_FLAG_NO_HOLE;
        }
        if fast {
            self.require(FLAG_SEND_FAST_ZERO, "FAST_ZERO")?;
            flags |= CMD_FLAG_FAST_ZERO;
        }
        if fua {
            self.require(FLAG_SEND_FUA, "FUA")?;
            flags |= CMD_FLAG_FUA;
        }
        self.ranged(CMD_WRITE_ZEROES, flags, offset, len).await
    }

    /// A command without payload over a range, in pieces a 32-bit length can carry.
    async fn ranged(
        &self,
        kind: u16,
        flags: u16,
        offset: u64,
        len: u64,
    ) -> Result<(), ClientError> {
        try_join_all(split(offset, len, RANGE_PIECE).into_iter().map(|(at, n)| {
            self.call(Command {
                kind,
                flags,
                offset: at,
                length: n,
                payload: None,
            })
        }))
        .await?;
        Ok(())
    }
}

/// The largest TRIM or WRITE_ZEROES length sent at once: a 32-bit length, kept a multiple of
/// any minimum block size (at most 64 KiB by the spec).
const RANGE_PIECE: u64 = 1 << 30;

/// `[offset, offset + len)` in pieces of at most `max` bytes (one empty piece for len 0).
fn split(offset: u64, len: u64, max: u64) -> Vec<(u64, u32)> {
    if len == 0 {
        return vec![(offset, 0)];
    }
    let mut pieces = Vec::new();
    let mut at = offset;
    let end = offset + len;
    while at < end {
        let n = (end - at).min(max);
        pieces.push((at, n as u32));
        at += n;
    }
    pieces
}

/// Connects, negotiates the export and starts the transmission phase.
async fn open(uri: &NbdUri, tls: Option<&ClientTls>) -> Result<Connection, ClientError> {
    let context = |e: ClientError| match e {
        ClientError::Io(io) => {
            ClientError::Io(std::io::Error::new(io.kind(), format!("{uri}: {io}")))
        }
        ClientError::Refused(why) => ClientError::Refused(format!("{uri}: {why}")),
        other => other,
    };
    match &uri.address {
        Address::Tcp(address) => {
            let stream = TcpStream::connect(address)
                .await
                .map_err(|e| context(e.into()))?;
            // Requests are small and latency-bound; Nagle would hold them back.
            let _ = stream.set_nodelay(true);
            start(stream, uri, tls).await.map_err(context)
        }
        Address::Unix(path) => {
            let stream = UnixStream::connect(path)
                .await
                .map_err(|e| context(e.into()))?;
            start(stream, uri, tls).await.map_err(context)
        }
    }
}

/// The handshake on a connected stream, upgraded to TLS first when `tls` says so.
async fn start<S: Transport>(
    mut stream: S,
    uri: &NbdUri,
    tls: Option<&ClientTls>,
) -> Result<Connection, ClientError> {
    let no_zeroes = handshake::greeting(&mut stream).await?;
    let Some(tls) = tls else {
        let info = handshake::negotiate(&mut stream, &uri.export, no_zeroes).await?;
        let (reader, writer) = stream.into_halves();
        return Ok(Connection::start(reader, writer, info, uri.text.clone()));
    };
    handshake::start_tls(&mut stream).await?;
    let mut stream = tls
        .connector()
        .connect(
            tls.server_name(),
            crate::transport::buffered_for_tls(stream),
        )
        .await
        .map_err(|e| ClientError::Refused(format!("TLS handshake failed: {e}")))?;
    let info = match handshake::negotiate(&mut stream, &uri.export, no_zeroes).await {
        Ok(info) => info,
        Err(ClientError::Io(io)) => return Err(tls_verdict(&mut stream, io).await),
        Err(other) => return Err(other),
    };
    let (reader, writer) = stream.into_halves();
    Ok(Connection::start(reader, writer, info, uri.text.clone()))
}

/// The reason behind an I/O error right after the TLS handshake. In TLS 1.3 the server
/// checks our certificate once our side of the handshake is done, so its verdict (an alert)
/// arrives on the first read, or after a write has already failed on the closed socket: read
/// once more to find it.
async fn tls_verdict<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut tokio_rustls::client::TlsStream<S>,
    io: std::io::Error,
) -> ClientError {
    let is_tls = |e: &std::io::Error| e.get_ref().is_some_and(|e| e.is::<rustls::Error>());
    if is_tls(&io) {
        return ClientError::Refused(format!("TLS: the server refused us: {io}"));
    }
    let mut byte = [0u8; 1];
    match stream.read(&mut byte).await {
        Err(alert) if is_tls(&alert) => {
            ClientError::Refused(format!("TLS: the server refused us: {alert}"))
        }
        _ => ClientError::Refused(format!(
            "the server closed the connection right after the TLS handshake (did it refuse our \
             certificate? its log says): {io}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_cuts_at_the_maximum_and_covers_the_range() {
        assert_eq!(split(10, 25, 10), vec![(10, 10), (20, 10), (30, 5)]);
        assert_eq!(split(0, 10, 10), vec![(0, 10)]);
        assert_eq!(split(7, 0, 10), vec![(7, 0)]);
    }
}
