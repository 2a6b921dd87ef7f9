//! Background work a layer runs (a rebuild, a resync, a metadata committer) is started, paused
//! and stopped through one handle, so that online changes and shutdown reach every kind of
//! background work the same way.
//!
//! ```ignore
//! // The layer owns the handle; the task gets a `Worker` and checks it between steps.
//! background.spawn(runtime.as_ref(), |worker| async move {
//!     while let Some(_step) = worker.step().await {   // waits while quiesced; None once stopped
//!         if !copy_one_region().await { return }
//!     }
//! });
//! background.quiesce().await; // no step runs from here on
//! background.resume();
//! background.stop().await;    // every task has returned
//! ```
//!
//! A step is the unit that must not be cut in half (one region copied, one batch of stripes
//! rebuilt and checkpointed): `quiesce` waits for the running step to end, never interrupts
//! it. Quiesces nest (each `quiesce` is undone by one `resume`), so two callers pausing the
//! same layer do not resume it under each other. Dropping the handle stops the work too
//! (without waiting): a task's `Weak` on its layer remains a fallback, not the only way out.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::watch;

use crate::{BlockError, Control, ControlReply, DeviceRef, Result, Runtime};

#[derive(Clone, Copy, Debug, Default)]
struct State {
    /// Quiesces not yet resumed.
    paused: u32,
    stopping: bool,
    /// Steps running now.
    steps: u32,
    /// Tasks spawned and not yet returned.
    workers: u32,
}

/// The handle a layer keeps on its background work; see the module docs.
pub struct Background {
    state: watch::Sender<State>,
}

impl Default for Background {
    fn default() -> Self {
        Background::new()
    }
}

impl Background {
    pub fn new() -> Background {
        Background {
            state: watch::Sender::new(State::default()),
        }
    }

    /// Spawns `task` on `runtime`, handing it the [`Worker`] it checks between steps.
    /// Returns false (and spawns nothing) once the work was stopped.
    pub fn spawn<F, Fut>(&self, runtime: &dyn Runtime, task: F) -> bool
    where
        F: FnOnce(Worker) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        // Counted before the spawn, so that a `stop` right after waits for it too.
        let admitted = self.state.send_if_modified(|s| {
            if s.stopping {
                return false;
            }
            s.workers += 1;
            true
        });
        if !admitted {
            return false;
        }
        let worker = Worker {
            state: self.state.clone(),
        };
        runtime.spawn(Box::pin(task(worker)));
        true
    }

    /// Pauses the work: no new step starts until [`Background::resume`]; returns once the
    /// steps running now have ended.
    pub async fn quiesce(&self) {
        self.state.send_modify(|s| s.paused += 1);
        self.wait_until(|s| s.steps == 0).await;
    }

    /// Undoes one [`Background::quiesce`].
    pub fn resume(&self) {
        self.state
            .send_modify(|s| s.paused = s.paused.saturating_sub(1));
    }

    /// Ends the work: every task returns at its next check (a quiesced one too), and no new
    /// one is spawned. Returns once every task has returned.
    pub async fn stop(&self) {
        self.state.send_modify(|s| s.stopping = true);
        self.wait_until(|s| s.workers == 0).await;
    }

    pub fn is_quiesced(&self) -> bool {
        self.state.borrow().paused > 0
    }

    pub fn is_stopped(&self) -> bool {
        self.state.borrow().stopping
    }

    /// Tasks spawned that have not returned yet.
    pub fn running(&self) -> u32 {
        self.state.borrow().workers
    }

    /// Answers the lifecycle verbs (`Quiesce`, `Resume`, `Stop`) for a layer whose
    /// background work is this; None for any other verb, which the layer handles itself.
    pub async fn control(&self, request: &Control) -> Option<ControlReply> {
        match request {
            Control::Quiesce => self.quiesce().await,
            Control::Resume => self.resume(),
            Control::Stop => self.stop().await,
            _ => return None,
        }
        Some(ControlReply::Done)
    }

    async fn wait_until(&self, done: impl FnMut(&State) -> bool) {
        let mut watching = self.state.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = watching.wait_for(done).await;
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // The layer is gone: its tasks end at their next check (nobody is left to wait).
        self.state.send_modify(|s| s.stopping = true);
    }
}

/// A background task's side of its [`Background`]: where it asks leave to run each step.
/// The task counts as running until its worker is dropped (it returned, or its future was
/// dropped).
pub struct Worker {
    state: watch::Sender<State>,
}

impl Worker {
    /// Waits while the work is quiesced, then starts a step that lasts until the guard is
    /// dropped. None once the work is stopped: the task should return.
    pub async fn step(&self) -> Option<StepGuard<'_>> {
        let mut watching = self.state.subscribe();
        loop {
            let mut stopped = false;
            let started = self.state.send_if_modified(|s| {
                stopped = s.stopping;
                if stopped || s.paused > 0 {
                    return false;
                }
                s.steps += 1;
                true
            });
            if stopped {
                return None;
            }
            if started {
                return Some(StepGuard { worker: self });
            }
            // Our own sender is alive, so the channel never closes under us.
            let _ = watching.wait_for(|s| s.stopping || s.paused == 0).await;
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.state.borrow().stopping
    }

    /// Sleeps `duration` on `runtime`, or less if the work is stopped meanwhile. Returns
    /// false if it was stopped (the task should return).
    pub async fn sleep(&self, runtime: &dyn Runtime, duration: Duration) -> bool {
        let mut watching = self.state.subscribe();
        let mut nap = runtime.sleep(duration);
        let mut stopped = pin!(watching.wait_for(|s| s.stopping));
        std::future::poll_fn(|context| {
            if stopped.as_mut().poll(context).is_ready() {
                return Poll::Ready(());
            }
            nap.as_mut().poll(context)
        })
        .await;
        !self.is_stopping()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.state.send_modify(|s| s.workers -= 1);
    }
}

/// A step under way; dropping it ends the step (see [`Worker::step`]).
pub struct StepGuard<'a> {
    worker: &'a Worker,
}

impl Drop for StepGuard<'_> {
    fn drop(&mut self) {
        self.worker.state.send_modify(|s| s.steps -= 1);
    }
}

/// Runs `work` with `device`'s background work quiesced, and resumes it afterwards, whatever
/// `work` returns: the one path online changes take. A device with no background work
/// (answering the verb `Unsupported`) simply runs `work`.
pub async fn while_quiesced<T>(device: &DeviceRef, work: impl Future<Output = T>) -> Result<T> {
    let quiesced = match device.control(Control::Quiesce).await {
        Ok(_) => true,
        Err(BlockError::Unsupported(_)) => false,
        Err(error) => return Err(error),
    };
    let result = work.await;
    if quiesced {
        device.control(Control::Resume).await?;
    }
    Ok(result)
}

/// Stops `device`'s background work and waits for it (server shutdown); a device with none
/// answers `Unsupported`, which counts as done.
pub async fn stop(device: &DeviceRef) -> Result<()> {
    match device.control(Control::Stop).await {
        Ok(_) | Err(BlockError::Unsupported(_)) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Tells `device` the server is done with it (`Control::Leave`); a device that is in no
/// cluster has nothing to do.
pub async fn leave(device: &DeviceRef) -> Result<()> {
    match device.control(Control::Leave).await {
        Ok(_) | Err(BlockError::Unsupported(_)) => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use tokio::sync::Notify;

    use super::*;
    use crate::TokioRuntime;

    /// A task whose steps each wait for `gate` to be opened; counts started and finished
    /// steps.
    struct Probe {
        started: AtomicU32,
        finished: AtomicU32,
        gate: Notify,
        entered: Notify,
    }

    fn spawn_probe(background: &Background) -> Arc<Probe> {
        let probe = Arc::new(Probe {
            started: AtomicU32::new(0),
            finished: AtomicU32::new(0),
            gate: Notify::new(),
            entered: Notify::new(),
        });
        let task = probe.clone();
        let runtime = TokioRuntime::current();
        assert!(
            background.spawn(runtime.as_ref(), move |worker| async move {
                while let Some(_step) = worker.step().await {
                    task.started.fetch_add(1, Ordering::SeqCst);
                    task.entered.notify_one();
                    task.gate.notified().await;
                    task.finished.fetch_add(1, Ordering::SeqCst);
                }
            })
        );
        probe
    }

    #[tokio::test]
    async fn quiesce_waits_for_the_running_step_and_no_step_starts_until_resumed() {
        let background = Background::new();
        let probe = spawn_probe(&background);
        probe.entered.notified().await;
        assert_eq!(probe.started.load(Ordering::SeqCst), 1);
        let mut quiescing = pin!(background.quiesce());
        // The running step holds the quiesce back.
        assert!(futures_poll_once(quiescing.as_mut()).await.is_pending());
        probe.gate.notify_one();
        quiescing.await;
        assert_eq!(probe.finished.load(Ordering::SeqCst), 1);
        assert!(background.is_quiesced());
        // Quiesced: the task is parked before its next step, however long we wait.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(probe.started.load(Ordering::SeqCst), 1);
        background.resume();
        probe.entered.notified().await;
        assert_eq!(probe.started.load(Ordering::SeqCst), 2);
        probe.gate.notify_one();
        probe.entered.notified().await;
        assert_eq!(probe.started.load(Ordering::SeqCst), 3);
        // Stop waits for the step under way to end, then the loop ends.
        let mut stopping = pin!(background.stop());
        assert!(futures_poll_once(stopping.as_mut()).await.is_pending());
        probe.gate.notify_one();
        stopping.await;
        assert_eq!(background.running(), 0);
        assert_eq!(probe.finished.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn quiesces_nest_and_stop_ends_a_quiesced_task() {
        let background = Background::new();
        background.quiesce().await;
        background.quiesce().await;
        let probe = spawn_probe(&background);
        background.resume();
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            probe.started.load(Ordering::SeqCst),
            0,
            "one quiesce remains"
        );
        assert_eq!(background.running(), 1);
        background.stop().await;
        assert_eq!(background.running(), 0);
        assert_eq!(probe.started.load(Ordering::SeqCst), 0);
        // Stopped work spawns nothing more.
        let runtime = TokioRuntime::current();
        assert!(!background.spawn(runtime.as_ref(), |_worker| async {}));
    }

    #[tokio::test]
    async fn a_sleeping_task_wakes_at_stop_and_dropping_the_handle_stops_it() {
        let runtime = TokioRuntime::current();
        let background = Background::new();
        let naps = Arc::new(AtomicU32::new(0));
        let counted = naps.clone();
        let sleeper = runtime.clone();
        background.spawn(runtime.as_ref(), move |worker| async move {
            while worker
                .sleep(sleeper.as_ref(), Duration::from_secs(3600))
                .await
            {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        tokio::task::yield_now().await;
        // Returns at once, not after the hour.
        background.stop().await;
        assert_eq!(background.running(), 0);
        assert_eq!(naps.load(Ordering::SeqCst), 0);

        let dropped = Background::new();
        let probe = spawn_probe(&dropped);
        probe.entered.notified().await;
        let state = dropped.state.clone();
        drop(dropped);
        probe.gate.notify_one();
        let mut watching = state.subscribe();
        let _ = watching.wait_for(|s| s.workers == 0).await;
        assert_eq!(probe.started.load(Ordering::SeqCst), 1);
    }

    /// Polls `future` once, to see whether it is still waiting.
    async fn futures_poll_once<F: Future + Unpin>(future: F) -> Poll<F::Output> {
        let mut future = future;
        std::future::poll_fn(|context| Poll::Ready(Pin::new(&mut future).poll(context))).await
    }

    use std::pin::Pin;
}
