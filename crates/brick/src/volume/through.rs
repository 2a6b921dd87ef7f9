//! The benchmark's baseline: the same RAIN-10 without intervals (the issue's "two-phase
//! commit overhead … against the same RAIN-10 without intervals", as RIBD measured its own
//! consistency intervals against RIBD without them).
//!
//! A write goes at once, through the same placement and the same brick connections, to every
//! brick of its mirror set (`WriteDirect`: written where the unit lives and made durable
//! before the answer), and a flush has nothing left to do. Nothing makes the bricks' copies
//! change together: a host that dies between its two `WriteDirect`s leaves the replicas
//! different, and nothing finds or repairs that. So a write is refused while any brick of
//! its set is down (nothing would record the region it misses), it is never what a shared
//! disk does unless its config says `unsafe-without-intervals`, and nothing but
//! `bench/shared.py` sets that.

use super::*;

impl SharedVolume {
    /// Switches this volume to writing through without intervals, before it serves anything.
    #[doc(hidden)]
    pub fn unsafe_without_intervals(&self) {
        tracing::warn!(volume = %self.name, "writing without consistency intervals: a failure can leave the replicas different (a benchmark's baseline)");
        self.without_intervals.store(true, Ordering::SeqCst);
    }

    pub(super) fn writes_through(&self) -> bool {
        self.without_intervals.load(Ordering::Relaxed)
    }

    /// Writes `data` to every brick of its set, durably, before answering.
    pub(super) async fn write_through(&self, offset: u64, data: Bytes) -> Result<()> {
        self.check_live()?;
        // The segments stay claimed while the write is on its way: another host's prepare
        // over them is fenced meanwhile, as it is against an interval.
        let segments = self.claims.segments_of(offset, data.len() as u64);
        let _pin = self.pin(&segments, self.timeout).await?;
        let (writes, missed) = self.plan(&[(offset, data)])?;
        if let Some(brick) = missed.keys().next() {
            return Err(io_error(format!(
                "volume {}: brick {} is down, and writes without intervals need every brick",
                self.name,
                self.brick_name(*brick)
            )));
        }
        let bricks = self.brick_clients();
        let sent = writes.into_iter().map(|(brick, list)| {
            let client = bricks[brick].clone();
            async move { (brick, client.write_direct(list).await) }
        });
        for (brick, answer) in futures_util::future::join_all(sent).await {
            answer.map_err(|e| {
                io_error(format!(
                    "volume {}: writing through to brick {}: {e}",
                    self.name,
                    self.brick_name(brick)
                ))
            })?;
        }
        Ok(())
    }
}
