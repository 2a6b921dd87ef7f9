//! Byte streams that carry NBD: whole during the handshake (which may upgrade them to TLS),
//! then cut into a reader half and a writer half for the transmission phase.

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};
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
