//! Bricks that stop answering: probed in the background until they answer again, and sent
//! nothing by the flushes meanwhile, so a brick that is black-holed rather than gone costs
//! them nothing.

use super::*;

/// How often a brick that stopped answering is probed, in the background, to see if it is
/// back. A brick that is black-holed rather than gone costs a probe the whole timeout; the
/// flushes never wait for one.
const PROBE_PAUSE: Duration = Duration::from_millis(250);

#[derive(Default)]
pub(super) struct Reach {
    /// A request to it failed, and no probe has seen it answer since.
    pub(super) unreachable: bool,
    /// A background probe is running.
    pub(super) probing: bool,
    /// Moves when the brick at this index is replaced: a probe of the old one, still
    /// running, then tells nothing about the new one.
    pub(super) generation: u64,
}

impl Reach {
    /// The brick at this index was replaced: the new one is presumed to answer.
    pub(super) fn replaced(&mut self) {
        self.unreachable = false;
        self.probing = false;
        self.generation += 1;
    }
}

impl SharedVolume {
    /// Whether `brick` may be sent something: it has not failed a request since a probe last
    /// saw it answer.
    pub(super) fn answers(&self, brick: usize) -> bool {
        !self.reach[brick].lock().unwrap().unreachable
    }

    /// `brick` did not answer a request: nothing more is sent to it from the flushes until a
    /// background probe sees it answer (every `PROBE_PAUSE`, each probe bounded by the
    /// timeout). The probe ends when it does, or when the volume is dropped.
    pub(super) fn unreachable(&self, brick: usize) {
        let mut reach = self.reach[brick].lock().unwrap();
        reach.unreachable = true;
        if reach.probing {
            return;
        }
        reach.probing = true;
        let generation = reach.generation;
        let (weak, client) = (Arc::downgrade(&self.reach[brick]), self.brick(brick));
        let (volume, name) = (self.name.clone(), self.brick_name(brick));
        tokio::spawn(async move {
            let probe = IntervalId { client: 0, seq: 0 };
            loop {
                tokio::time::sleep(PROBE_PAUSE).await;
                let answered = client.status(probe).await.is_ok();
                let Some(reach) = weak.upgrade() else {
                    return;
                };
                let mut reach = reach.lock().unwrap();
                if reach.generation != generation {
                    return;
                }
                if answered {
                    reach.unreachable = false;
                    reach.probing = false;
                    tracing::info!(%volume, brick = %name, "brick answers again");
                    return;
                }
            }
        });
    }
}
