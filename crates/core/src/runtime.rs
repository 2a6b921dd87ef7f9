//! Time, concurrency and randomness come from the runtime a device runs in, never from the OS
//! directly: that is what lets the simulator run the same layer code in virtual time, and
//! the same way from the same seed.

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

    /// 64 random bits, for what a layer picks at random when it formats (a metadata store's
    /// first generation). From the OS by default; the simulator draws them from its seed.
    fn random_u64(&self) -> u64 {
        os_random_u64()
    }
}

/// 64 random bits from the OS, by way of the standard library's randomly keyed hasher.
pub fn os_random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(u64::from(std::process::id()));
    hasher.finish()
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

/// The real runtime: tokio's executor, its blocking pool and the monotonic clock.
pub struct TokioRuntime {
    handle: tokio::runtime::Handle,
    /// tokio's clock, so that tests with a paused clock (`start_paused`) see virtual time.
    started: tokio::time::Instant,
}

impl TokioRuntime {
    /// Binds to the tokio runtime the caller runs in.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn current() -> std::sync::Arc<Self> {
        std::sync::Arc::new(TokioRuntime {
            handle: tokio::runtime::Handle::current(),
            started: tokio::time::Instant::now(),
        })
    }
}

impl Runtime for TokioRuntime {
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }

    fn spawn(&self, task: BoxFuture<'static, ()>) {
        self.handle.spawn(task);
    }

    fn spawn_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) {
        self.handle.spawn_blocking(work);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn run_blocking_returns_the_work_result() {
        let runtime = TokioRuntime::current();
        let value = run_blocking(runtime.as_ref(), || 6 * 7).await;
        assert_eq!(value, 42);
        let before = runtime.now();
        runtime.sleep(Duration::from_millis(2)).await;
        assert!(runtime.now() >= before + Duration::from_millis(2));
    }

    #[tokio::test]
    async fn the_real_runtime_draws_random_bits_from_the_os() {
        let runtime = TokioRuntime::current();
        let draws: std::collections::BTreeSet<u64> = (0..8).map(|_| runtime.random_u64()).collect();
        assert_eq!(draws.len(), 8, "{draws:?}");
    }
}
