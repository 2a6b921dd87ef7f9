//! What the layers' tests share beyond the crash harness proper.
//!
//! Above all a test device that sees every request before it goes down to the device it
//! wraps. Layer tests keep needing a disk that does one thing on the side: holds a flush at a
//! gate, counts member I/O by region, fails writes on demand. Each wrote its own nine-method
//! forwarding `BlockDevice`; here the forwarding is written once, and a test says only what
//! happens first ([`Interceptor::before`]).

use std::ops::Deref;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::{async_trait, DeviceRef, Filter, Result, WriteFlags, ZeroFlags};

/// The child names `d0`, `d1`, … that tests give an array's `n` slots.
pub fn slot_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("d{i}")).collect()
}

/// Asserts that `result` failed with a message naming every one of `words`; `what` is the
/// panic message should it have succeeded (what had to be refused).
#[track_caller]
pub fn assert_refused<T, E: std::fmt::Display>(
    result: std::result::Result<T, E>,
    what: &str,
    words: &[&str],
) {
    let Err(error) = result else {
        panic!("{what}");
    };
    let message = error.to_string();
    for word in words {
        assert!(message.contains(word), "{word:?} not in: {message}");
    }
}

/// The panic message of `run`, which must panic (a planted bug the harness must catch);
/// `why` is the panic message should it return instead.
pub fn panic_report<R>(run: impl FnOnce() -> R, why: &str) -> String {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(_) => panic!("{why}"),
        Err(payload) => crate::panic_message(&*payload),
    }
}

/// Runs `test` to completion on a new current-thread runtime: for test bodies that are not
/// async themselves (proptest cases, [`crate::CrashRun`] closures).
pub fn block_on<F: std::future::Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
        .block_on(test)
}

/// A request on its way down, as an [`Interceptor`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    Read { offset: u64, len: u64 },
    Write { offset: u64, len: u64 },
    Flush,
    Discard { offset: u64, len: u64 },
    WriteZeroes { offset: u64, len: u64 },
}

/// What a test device does before a request reaches the device below.
#[async_trait]
pub trait Interceptor: Send + Sync {
    /// Runs before `request` goes down; an error answers the request instead (it never
    /// reaches the device below).
    async fn before(&self, request: Request) -> Result<()>;
}

/// `inner` with an [`Interceptor`] in front of its reads, writes, flushes, discards and
/// zeroings; geometry, capabilities, block status and control pass straight through.
/// Call it through `BlockDevice` (a `DeviceRef`): see [`Filter`].
pub struct Intercepted<I> {
    inner: DeviceRef,
    interceptor: I,
}

impl<I: Interceptor + 'static> Intercepted<I> {
    pub fn new(inner: DeviceRef, interceptor: I) -> Arc<Intercepted<I>> {
        Arc::new(Intercepted { inner, interceptor })
    }
}

/// The test reaches its interceptor's state (gates, counters) through the device.
impl<I> Deref for Intercepted<I> {
    type Target = I;

    fn deref(&self) -> &I {
        &self.interceptor
    }
}

/// Forwarding comes from [`Filter`]; only the intercepted requests are written out.
#[async_trait]
impl<I: Interceptor> Filter for Intercepted<I> {
    fn next(&self) -> &DeviceRef {
        &self.inner
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let len64 = len as u64;
        self.interceptor
            .before(Request::Read { offset, len: len64 })
            .await?;
        self.inner.read(offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        let len = data.len() as u64;
        self.interceptor
            .before(Request::Write { offset, len })
            .await?;
        self.inner.write(offset, data, flags).await
    }

    async fn flush(&self) -> Result<()> {
        self.interceptor.before(Request::Flush).await?;
        self.inner.flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.interceptor
            .before(Request::Discard { offset, len })
            .await?;
        self.inner.discard(offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.interceptor
            .before(Request::WriteZeroes { offset, len })
            .await?;
        self.inner.write_zeroes(offset, len, flags).await
    }
}
