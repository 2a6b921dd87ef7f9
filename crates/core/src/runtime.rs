//! Time and concurrency come from the runtime a device runs in, never from the OS directly:
//! that is what lets the simulator run the same layer code in virtual time.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The services a layer may use besides its children.
pub trait Runtime: Send + Sync + 'static {
    /// Monotonic time since the runtime started.
    fn now(&self) -> Duration;

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;

    /// Runs a future concurrently with the caller.
    fn spawn(&self, task: BoxFuture<'static, ()>);

    /// Runs blocking work (a system call) off the async threads.
    fn spawn_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>);
}

/// Runs `work` through [`Runtime::spawn_blocking`] and waits for its result.
pub async fn run_blocking<T, F>(runtime: &dyn Runtime, work: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (done, result) = tokio::sync::oneshot::channel();
    runtime.spawn_blocking(Box::new(move || {
        // The receiver only goes away if the caller was cancelled; the result is then unwanted.
        let _ = done.send(work());
    }));
    result
        .await
        .expect("a runtime must run every blocking task it accepts to completion")
}
