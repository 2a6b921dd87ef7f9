//! A remote export as a [`BlockDevice`]: what the server advertises becomes the device's
//! geometry and capabilities, and its answers become [`BlockError`]s.

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, errno, write_zeroes_by_writing, BlockDevice, BlockError, Capabilities, Control,
    ControlReply, Geometry, Health, NodeStatus, Result, WriteFlags, ZeroFlags,
};

use super::{Client, ClientError, ClientOptions, LinkState, NbdUri};
use crate::proto::*;
use crate::tls::ClientTls;

/// A block device served by an NBD server.
pub struct RemoteDevice {
    client: Client,
    geometry: Geometry,
    /// Read-only by the export's flags or by our own choice.
    read_only: bool,
}

impl RemoteDevice {
    /// Connects to `uri`; fails (naming the URI) when the server cannot be reached or refuses
    /// the export.
    pub async fn connect(uri: NbdUri, options: ClientOptions) -> Result<RemoteDevice> {
        RemoteDevice::connect_with(uri, options, None).await
    }

    /// [`RemoteDevice::connect`], upgrading to TLS with `tls` (for an `nbds://` URI).
    pub async fn connect_with(
        uri: NbdUri,
        options: ClientOptions,
        tls: Option<ClientTls>,
    ) -> Result<RemoteDevice> {
        let text = uri.text.clone();
        let client = Client::connect_with(uri, options, tls)
            .await
            .map_err(|e| to_block_error(&text, "connecting", e))?;
        Ok(RemoteDevice::new(client))
    }

    pub fn new(client: Client) -> RemoteDevice {
        let info = client.info();
        let min_io = info.min_block.max(1);
        let geometry = Geometry {
            size: info.size,
            min_io,
            logical_block: min_io.max(512),
            physical_block: info.preferred_block.max(min_io),
            preferred_io: info.preferred_block.max(min_io),
            // Larger requests are cut to the server's maximum payload by the client.
            max_io: 32 << 20,
        };
        let read_only = info.has(FLAG_READ_ONLY);
        RemoteDevice {
            client,
            geometry,
            read_only,
        }
    }

    /// Refuses writes even where the export takes them.
    pub fn read_only(mut self, read_only: bool) -> RemoteDevice {
        self.read_only |= read_only;
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn error(&self, op: &str, e: ClientError) -> BlockError {
        to_block_error(&self.client.uri().text, op, e)
    }

    fn check_write(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        if self.read_only {
            return Err(BlockError::ReadOnly);
        }
        Ok(())
    }
}

/// The server's errno as the error kind it stands for; the rest as I/O errors naming the URI.
fn to_block_error(uri: &str, op: &str, e: ClientError) -> BlockError {
    match e {
        ClientError::Remote {
            errno: code,
            message,
        } => match code {
            errno::EPERM => BlockError::ReadOnly,
            errno::EINVAL => BlockError::InvalidArgument(format!("{uri}: {op}: {message}")),
            errno::ENOSPC => BlockError::NoSpace,
            errno::ENOTSUP => BlockError::Unsupported("an operation the remote server refused"),
            code => BlockError::io(
                format!("{uri}: {op}: the server answered errno {code} {message}"),
                std::io::Error::from_raw_os_error(code as i32),
            ),
        },
        ClientError::Unsupported(what) => BlockError::Unsupported(what),
        ClientError::TimedOut(why) => BlockError::io(
            format!("{op}: {why}"),
            std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"),
        ),
        ClientError::Io(io) => BlockError::io(format!("{uri}: {op}: {}", detail(uri, &io)), io),
        other => {
            let why = detail(uri, &other);
            BlockError::io(
                format!("{uri}: {op}: {why}"),
                std::io::Error::new(std::io::ErrorKind::ConnectionAborted, why),
            )
        }
    }
}

/// An error's message without the URI it may already start with: the reason (a refusal, a
/// failed TLS handshake) belongs in the device error's own message, which is what the log
/// and the administrator see.
fn detail(uri: &str, error: &dyn std::fmt::Display) -> String {
    let text = error.to_string();
    match text.strip_prefix(uri) {
        Some(rest) => rest.trim_start_matches(": ").to_string(),
        None => text,
    }
}

#[async_trait]
impl BlockDevice for RemoteDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        let info = self.client.info();
        Capabilities {
            read_only: self.read_only,
            flush: info.has(FLAG_SEND_FLUSH),
            fua: info.has(FLAG_SEND_FUA),
            discard: info.has(FLAG_SEND_TRIM),
            write_zeroes: info.has(FLAG_SEND_WRITE_ZEROES),
            fast_zero: info.has(FLAG_SEND_FAST_ZERO),
            block_status: false,
            consistent_across_openers: info.has(FLAG_CAN_MULTI_CONN),
            rotational: info.has(FLAG_ROTATIONAL),
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry.check_range(offset, len as u64)?;
        self.client
            .read(offset, len)
            .await
            .map_err(|e| self.error("read", e))
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.check_write(offset, data.len() as u64)?;
        let info = self.client.info();
        // Without native FUA, a write followed by a flush keeps the same promise.
        let native_fua = flags.fua && info.has(FLAG_SEND_FUA);
        self.client
            .write(offset, data, native_fua)
            .await
            .map_err(|e| self.error("write", e))?;
        if flags.fua && !native_fua {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        // A server without FLUSH has no volatile cache to empty: writes are durable.
        if !self.client.info().has(FLAG_SEND_FLUSH) {
            return Ok(());
        }
        self.client
            .flush()
            .await
            .map_err(|e| self.error("flush", e))
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check_write(offset, len)?;
        // Discard is a hint: a server without TRIM keeps the bytes, which the contract allows.
        if !self.client.info().has(FLAG_SEND_TRIM) || len == 0 {
            return Ok(());
        }
        self.client
            .trim(offset, len)
            .await
            .map_err(|e| self.error("trim", e))
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.check_write(offset, len)?;
        let info = self.client.info();
        if !info.has(FLAG_SEND_WRITE_ZEROES) {
            return write_zeroes_by_writing(self, offset, len, flags).await;
        }
        if len == 0 {
            return Ok(());
        }
        let native_fua = flags.fua && info.has(FLAG_SEND_FUA);
        self.client
            .write_zeroes(offset, len, flags.may_trim, flags.fast, native_fua)
            .await
            .map_err(|e| self.error("write-zeroes", e))?;
        if flags.fua && !native_fua {
            self.flush().await?;
        }
        Ok(())
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => {
                let uri = self.client.uri().text.clone();
                let (health, state) = match self.client.state() {
                    LinkState::Connected => (Health::Ok, "connected".to_string()),
                    // Down until a request reconnects: a layer above that saw the requests
                    // fail has failed this member; status must not call it healthy meanwhile.
                    LinkState::Down(why) => (Health::Failed, format!("down ({why})")),
                };
                let mut status = NodeStatus::new(uri.clone(), "remote", self.geometry.size);
                status.health = match health {
                    Health::Ok if self.read_only => Health::ReadOnly,
                    health => health,
                };
                status.detail = vec![
                    ("uri".into(), uri),
                    ("connection".into(), state),
                    ("connections".into(), self.client.connections().to_string()),
                    (
                        "timeout".into(),
                        strata_core::duration::format_duration(self.client.options().timeout),
                    ),
                ];
                Ok(ControlReply::Describe(status))
            }
            _ => Err(BlockError::Unsupported("control verb on a remote device")),
        }
    }
}
