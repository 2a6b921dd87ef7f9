//! One NBD connection's view of a shared volume: its own stream of intervals, so that its
//! flush commits its writes, and only its writes, as one interval (the issue's "a FLUSH closes
//! the interval of that connection"). The NBD server asks for it with `Control::Connection`.

use super::*;

pub(super) struct ConnectionView {
    volume: Arc<SharedVolume>,
    stream: tokio::sync::Mutex<Stream>,
}

impl ConnectionView {
    pub(super) fn new(volume: Arc<SharedVolume>) -> ConnectionView {
        ConnectionView {
            volume,
            stream: tokio::sync::Mutex::new(Stream::default()),
        }
    }
}

/// A connection that ends with writes it never flushed: they were acknowledged, so they join
/// the volume's own stream and are committed from there, at once in the background; if that
/// fails they stay there, for the volume's next flush (the server's last one at shutdown
/// reports them), as a disk's cache is written back after its last client goes.
impl Drop for ConnectionView {
    fn drop(&mut self) {
        let stream = std::mem::take(self.stream.get_mut());
        if stream.pending.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!(volume = %self.volume.name, writes = stream.pending.len(), "a connection ended with writes not flushed and no runtime to commit them");
            return;
        };
        // Handed over now, not in the task: a flush of the volume that comes first (the
        // server's last, at shutdown) must find them.
        self.volume.left.lock().unwrap().push(stream);
        let volume = self.volume.clone();
        runtime.spawn(async move {
            if let Err(error) = volume.flush().await {
                tracing::warn!(volume = %volume.name, %error, "the writes a connection left unflushed are not committed yet; the next flush tries again");
            }
        });
    }
}

#[async_trait]
impl BlockDevice for ConnectionView {
    fn geometry(&self) -> Geometry {
        self.volume.geometry()
    }

    fn capabilities(&self) -> Capabilities {
        self.volume.capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.volume.read_in(&self.stream, offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.volume
            .write_in(&self.stream, offset, data, flags)
            .await
    }

    async fn flush(&self) -> Result<()> {
        self.volume.commit(&mut *self.stream.lock().await).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        self.volume.control(request).await
    }
}
