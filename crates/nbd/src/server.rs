//! Listeners, connections and orderly shutdown.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::DuplexStream;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{watch, Notify, Semaphore};
use tracing::{debug, info, warn};

use crate::export::{Export, Exports};
use crate::handshake::{greet, haggle, HandshakeError, Negotiated, Outcome, TlsContext};
use crate::tls::{Peer, ServerTls, TlsMode};
use crate::transmission::{serve, SessionEnd};
use crate::transport::{Halves, Transport};
use crate::Limits;

/// A bound socket the server accepts clients on.
pub enum Listener {
    Unix {
        listener: UnixListener,
        path: PathBuf,
    },
    Tcp(TcpListener),
}

impl Listener {
    pub fn describe(&self) -> String {
        match self {
            Listener::Unix { path, .. } => format!("unix:{}", path.display()),
            Listener::Tcp(listener) => match listener.local_addr() {
                Ok(addr) => format!("tcp:{addr}"),
                Err(_) => "tcp:?".into(),
            },
        }
    }
}

/// An NBD server: exports, limits, and the connections it is serving.
pub struct Server {
    exports: Arc<Exports>,
    limits: Limits,
    tls: ServerTls,
    shutdown: watch::Sender<bool>,
    connection_slots: Arc<Semaphore>,
    connections_total: AtomicU64,
    /// Sessions past their handshake, by connection id: the export each one opened and the
    /// switch that ends it. Lets an export be taken away from the clients using it.
    sessions: Mutex<HashMap<u64, SessionEntry>>,
    /// Woken whenever a session ends.
    session_ended: Notify,
}

struct SessionEntry {
    export: Arc<Export>,
    stop: watch::Sender<bool>,
}

impl Server {
    pub fn new(exports: Arc<Exports>, limits: Limits) -> Arc<Self> {
        Server::with_tls(exports, limits, ServerTls::off())
    }

    /// A server that offers (or requires) STARTTLS as `tls` says.
    pub fn with_tls(exports: Arc<Exports>, limits: Limits, tls: ServerTls) -> Arc<Self> {
        let (shutdown, _) = watch::channel(false);
        Arc::new(Server {
            exports,
            tls,
            connection_slots: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            shutdown,
            connections_total: AtomicU64::new(0),
            sessions: Mutex::new(HashMap::new()),
            session_ended: Notify::new(),
        })
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<u64, SessionEntry>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Clients in session on `export` (this very export, not a later one of the same name).
    pub fn clients_of(&self, export: &Arc<Export>) -> usize {
        self.sessions()
            .values()
            .filter(|s| Arc::ptr_eq(&s.export, export))
            .count()
    }

    /// Ends every session on `export` as a shutdown does: it stops reading requests, answers
    /// those it accepted, then closes the connection. Waits up to `timeout` for them to end;
    /// returns how many sessions are still open (0 when all ended).
    pub async fn disconnect(&self, export: &Arc<Export>, timeout: Duration) -> usize {
        for session in self.sessions().values() {
            if Arc::ptr_eq(&session.export, export) {
                session.stop.send_replace(true);
            }
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ended = self.session_ended.notified();
            let open = self.clients_of(export);
            if open == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return self.clients_of(export);
            }
        }
    }

    pub fn exports(&self) -> &Arc<Exports> {
        &self.exports
    }

    /// Clients connected right now.
    pub fn connections_open(&self) -> usize {
        self.limits.max_connections - self.connection_slots.available_permits()
    }

    /// Clients accepted since start.
    pub fn connections_total(&self) -> u64 {
        self.connections_total.load(Ordering::Relaxed)
    }

    /// Accepts clients until shutdown. Each client runs in its own task.
    pub async fn run(self: Arc<Self>, listener: Listener) {
        let mut shutdown = self.shutdown.subscribe();
        let name = listener.describe();
        loop {
            let accepted = tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => break,
                accepted = accept(&listener) => accepted,
            };
            match accepted {
                Ok(Accepted::Tcp(stream, peer)) => self.clone().start(stream, peer),
                Ok(Accepted::Unix(stream)) => self.clone().start(stream, "unix".into()),
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning on the error.
                    warn!(listener = %name, "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        if let Listener::Unix { path, .. } = &listener {
            let _ = std::fs::remove_file(path);
        }
        debug!(listener = %name, "stopped accepting");
    }

    /// Serves one already-connected byte stream (a pipe in tests).
    pub async fn serve_stream(self: Arc<Self>, stream: DuplexStream, peer: String) {
        let id = self.connections_total.fetch_add(1, Ordering::Relaxed) + 1;
        self.connection(id, stream, &peer).await;
    }

    fn start<S: Transport>(self: Arc<Self>, stream: S, peer: String) {
        let Ok(slot) = self.connection_slots.clone().try_acquire_owned() else {
            warn!(%peer, "refusing client: {} connections open", self.limits.max_connections);
            return;
        };
        let id = self.connections_total.fetch_add(1, Ordering::Relaxed) + 1;
        tokio::spawn(async move {
            self.connection(id, stream, &peer).await;
            drop(slot);
        });
    }

    /// The handshake, with the TLS upgrade when the client asks for it: the agreement and
    /// the stream's halves for the transmission phase.
    async fn handshake<S: Transport>(
        &self,
        mut stream: S,
    ) -> Result<(Negotiated, Halves), HandshakeError> {
        let no_zeroes = greet(&mut stream).await?;
        let mut options_left = self.limits.max_options;
        let plaintext = TlsContext {
            mode: self.tls.mode,
            peer: &Peer::Plaintext,
        };
        let outcome = haggle(
            &mut stream,
            no_zeroes,
            &self.exports,
            &self.limits,
            plaintext,
            &mut options_left,
        )
        .await?;
        if let Outcome::Go(negotiated) = outcome {
            return Ok((negotiated, stream.into_halves()));
        }
        let acceptor = self
            .tls
            .acceptor()
            .expect("STARTTLS is accepted only with TLS on");
        let mut stream = acceptor
            .accept(crate::transport::buffered_for_tls(stream))
            .await
            .map_err(|e| HandshakeError::Refused(format!("TLS handshake failed: {e}")))?;
        let session = stream.get_ref().1;
        let agreed = |what: Option<String>| what.unwrap_or_else(|| "unknown".into());
        info!(
            version = %agreed(session.protocol_version().map(|v| format!("{v:?}"))),
            suite = %agreed(session.negotiated_cipher_suite().map(|s| format!("{:?}", s.suite()))),
            "TLS session established"
        );
        let peer = Peer::Tls(
            session
                .peer_certificates()
                .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
                .unwrap_or_default(),
        );
        let encrypted = TlsContext {
            mode: self.tls.mode,
            peer: &peer,
        };
        match haggle(
            &mut stream,
            no_zeroes,
            &self.exports,
            &self.limits,
            encrypted,
            &mut options_left,
        )
        .await?
        {
            Outcome::Go(negotiated) => Ok((negotiated, stream.into_halves())),
            Outcome::StartTls => unreachable!("a second STARTTLS is refused"),
        }
    }

    async fn connection<S: Transport>(&self, id: u64, stream: S, peer: &str) {
        let mut shutdown = self.shutdown.subscribe();
        let handshake = self.handshake(stream);
        let negotiated = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            result = tokio::time::timeout(self.limits.handshake_timeout, handshake) => result,
        };
        let (negotiated, (reader, writer)) = match negotiated {
            Ok(Ok(negotiated)) => negotiated,
            Ok(Err(HandshakeError::Closed | HandshakeError::Aborted)) => {
                debug!(id, %peer, "client left during the handshake");
                return;
            }
            Ok(Err(e)) => {
                warn!(id, %peer, "handshake failed: {e}");
                return;
            }
            Err(_) => {
                warn!(id, %peer, "handshake timed out");
                return;
            }
        };
        let export = negotiated.export.name.clone();
        let identity = negotiated.identity.clone().unwrap_or_default();
        info!(id, %peer, %export, %identity, structured = negotiated.structured_replies, "client connected");
        let stop = self.register(id, negotiated.export.clone());
        let end = serve(reader, writer, negotiated, self.limits, stop).await;
        self.sessions().remove(&id);
        self.session_ended.notify_waiters();
        match end {
            SessionEnd::ClientDone => info!(id, %export, "client disconnected"),
            SessionEnd::Shutdown => {
                info!(id, %export, "session closed (server shutdown or export removed)")
            }
            SessionEnd::Dropped(why) => warn!(id, %peer, %export, "dropped client: {why}"),
        }
    }

    /// The server's TLS mode.
    pub fn tls_mode(&self) -> TlsMode {
        self.tls.mode
    }

    /// Records a session and returns its stop switch, already on if the server is shutting
    /// down (checked under the same lock `shutdown` takes, so no session misses it).
    fn register(&self, id: u64, export: Arc<Export>) -> watch::Receiver<bool> {
        let mut sessions = self.sessions();
        let (stop, receiver) = watch::channel(*self.shutdown.borrow());
        sessions.insert(id, SessionEntry { export, stop });
        receiver
    }

    /// Stops accepting clients and requests; sessions answer what they already accepted.
    pub fn shutdown(&self) {
        let sessions = self.sessions();
        self.shutdown.send_replace(true);
        for session in sessions.values() {
            session.stop.send_replace(true);
        }
    }

    /// Waits until every connection has ended, or `timeout` passes. Returns whether all ended.
    pub async fn wait_closed(&self, timeout: Duration) -> bool {
        let all = self.limits.max_connections as u32;
        let slots = self.connection_slots.clone();
        tokio::time::timeout(timeout, slots.acquire_many_owned(all))
            .await
            .is_ok()
    }
}

enum Accepted {
    Tcp(TcpStream, String),
    Unix(UnixStream),
}

async fn accept(listener: &Listener) -> std::io::Result<Accepted> {
    match listener {
        Listener::Unix { listener, .. } => {
            let (stream, _) = listener.accept().await?;
            enlarge_send_buffer(&stream);
            Ok(Accepted::Unix(stream))
        }
        Listener::Tcp(listener) => {
            let (stream, peer) = listener.accept().await?;
            // Replies are small and latency-bound; Nagle would hold them back.
            if let Err(e) = stream.set_nodelay(true) {
                debug!("TCP_NODELAY: {e}");
            }
            enlarge_send_buffer(&stream);
            Ok(Accepted::Tcp(stream, peer.to_string()))
        }
    }
}

/// Room for a few maximum-size read replies in the socket, so that sending one does not stall
/// on every ~200 KiB the client drains (the kernel caps this at net.core.wmem_max).
const SEND_BUFFER_BYTES: usize = 4 << 20;

fn enlarge_send_buffer(socket: &impl std::os::fd::AsFd) {
    if let Err(e) = rustix::net::sockopt::set_socket_send_buffer_size(socket, SEND_BUFFER_BYTES) {
        debug!("SO_SNDBUF: {e}");
    }
}
