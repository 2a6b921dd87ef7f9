//! Byte streams that carry NBD: whole during the handshake (which may upgrade them to TLS),
//! then cut into a reader half and a writer half for the transmission phase.

use tokio::io::{AsyncRead, AsyncWrite, BufReader, DuplexStream};
use tokio::net::{TcpStream, UnixStream};

/// A stream's two halves, boxed: sockets split without a lock, TLS streams with one.
pub type Halves = (
    Box<dyn AsyncRead + Unpin + Send>,
    Box<dyn AsyncWrite + Unpin + Send>,
);

/// A connected byte stream the server can serve: read and written whole during the
/// handshake, then cut into halves that the transmission phase's reader and writer own.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn into_halves(self) -> Halves;
}

impl Transport for TcpStream {
    fn into_halves(self) -> Halves {
        let (reader, writer) = self.into_split();
        (Box::new(reader), Box::new(writer))
    }
}

impl Transport for UnixStream {
    fn into_halves(self) -> Halves {
        let (reader, writer) = self.into_split();
        (Box::new(reader), Box::new(writer))
    }
}

impl Transport for DuplexStream {
    fn into_halves(self) -> Halves {
        let (reader, writer) = tokio::io::split(self);
        (Box::new(reader), Box::new(writer))
    }
}

/// What a TLS session reads from its socket at most per call.
const TLS_READ_BUFFER: usize = 64 * 1024;

/// The socket under a TLS session, read through a buffer. rustls asks its socket for at most
/// 4 KiB more than it already holds, so each 4 KiB write request (or read reply) took two
/// `recv` calls and a 1 MiB one 257, where a plaintext session's 128 KiB buffer takes many
/// requests per call. Writes pass straight through (rustls already gathers them).
pub fn buffered_for_tls<S: Transport>(stream: S) -> BufReader<S> {
    BufReader::with_capacity(TLS_READ_BUFFER, stream)
}

impl<S: Transport> Transport for BufReader<S> {
    fn into_halves(self) -> Halves {
        let (reader, writer) = tokio::io::split(self);
        (Box::new(reader), Box::new(writer))
    }
}

impl<S: Transport> Transport for tokio_rustls::server::TlsStream<S> {
    fn into_halves(self) -> Halves {
        let (reader, writer) = tokio::io::split(self);
        (Box::new(reader), Box::new(writer))
    }
}

impl<S: Transport> Transport for tokio_rustls::client::TlsStream<S> {
    fn into_halves(self) -> Halves {
        let (reader, writer) = tokio::io::split(self);
        (Box::new(reader), Box::new(writer))
    }
}
