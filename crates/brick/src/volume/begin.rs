//! Intervals a client thread begins and ends through the API (RIBD's `begin` … `end`): each
//! [`Interval`] is a stream of its own, its writes seen by it alone until `end` commits them
//! on every brick they touch, or on none. Dropping it (or `abort`) discards them: nothing of
//! an interval not ended was ever acknowledged as written.

use super::*;

/// One client thread's interval, begun with [`SharedVolume::begin`].
pub struct Interval {
    volume: Arc<SharedVolume>,
    stream: tokio::sync::Mutex<Stream>,
}

impl SharedVolume {
    /// Begins an interval. Several may be open at once, from one thread or many; each is
    /// committed, or discarded, alone.
    pub fn begin(self: &Arc<Self>) -> Interval {
        Interval {
            volume: self.clone(),
            stream: tokio::sync::Mutex::new(Stream::default()),
        }
    }
}

impl Interval {
    /// The most an interval holds: what one prepare carries to a brick.
    pub const MAX_BYTES: u64 = MAX_PENDING;

    /// Adds a write. The segments it meets are claimed for this host now, and held until
    /// the interval ends or is dropped. A write past [`Self::MAX_BYTES`] in all is refused
    /// (the volume's own streams commit early there; an interval cannot, or it would not be
    /// atomic).
    pub async fn write(&mut self, offset: u64, data: Bytes) -> Result<()> {
        let held = self.stream.get_mut().pending_bytes;
        if held + data.len() as u64 > Self::MAX_BYTES {
            return Err(BlockError::InvalidArgument(format!(
                "volume {}: an interval holds at most {} bytes; it has {held} and this write \
                 adds {}",
                self.volume.name,
                Self::MAX_BYTES,
                data.len()
            )));
        }
        self.volume
            .write_in(&self.stream, offset, data, WriteFlags::default())
            .await
    }

    /// Reads what is committed, with this interval's own writes over it.
    pub async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.volume.read_in(&self.stream, offset, len).await
    }

    /// Commits the interval: all of its writes on every brick they touch, or none. An
    /// error means it is not known to be committed; if some brick may hold it prepared, the
    /// volume settles it, entirely one way, at its next flush.
    pub async fn end(mut self) -> Result<()> {
        let mut stream = std::mem::take(self.stream.get_mut());
        self.volume.commit(&mut stream).await
    }

    /// Discards the interval's writes.
    pub fn abort(self) {}
}

impl Drop for Interval {
    fn drop(&mut self) {
        let stream = self.stream.get_mut();
        if !stream.pending.is_empty() {
            tracing::debug!(volume = %self.volume.name, writes = stream.pending.len(), "interval dropped without end: its writes are discarded");
        }
    }
}
