//! The brick service: a [`BrickStore`] answering the transaction channel.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_cluster::interval::{Decision, IntervalId, Status as IntervalStatus};
use strata_core::BlockError;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use super::proto::{self, brick_server};
use super::{by_reference, wire, MAX_MESSAGE};
use crate::metrics::{BrickMetrics, RpcKind};
use crate::store::{BrickStore, Vote};

pub struct BrickService {
    store: Arc<BrickStore>,
    faults: Arc<ServerFaults>,
    metrics: BrickMetrics,
}

/// Test-only faults of a brick server, switched on and off while it runs.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct ServerFaults {
    /// Decisions are taken in and never answered nor applied: a brick that voted, then died
    /// before it heard the decision.
    pub swallow_decisions: std::sync::atomic::AtomicBool,
    /// Each prepare is held this many milliseconds before it is taken in: a slow brick, so
    /// that a test sees which prepares are in progress at once.
    pub prepare_delay_ms: std::sync::atomic::AtomicU64,
    /// Each decision is held a random time below this many milliseconds before it is taken
    /// in.
    pub decide_jitter_ms: std::sync::atomic::AtomicU64,
    /// Prepares in progress now, and the most there have been at once.
    pub prepares_open: std::sync::atomic::AtomicUsize,
    pub prepares_most: std::sync::atomic::AtomicUsize,
}

impl ServerFaults {
    /// Counts a prepare in progress until the returned guard is dropped.
    fn prepare_open(&self) -> impl Drop + '_ {
        use std::sync::atomic::Ordering::SeqCst;
        let open = self.prepares_open.fetch_add(1, SeqCst) + 1;
        self.prepares_most.fetch_max(open, SeqCst);
        struct Open<'a>(&'a ServerFaults);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                self.0.prepares_open.fetch_sub(1, SeqCst);
            }
        }
        Open(self)
    }
}

impl BrickService {
    pub fn new(store: Arc<BrickStore>) -> BrickService {
        Self::with_faults(store, Arc::default())
    }

    #[doc(hidden)]
    pub fn with_faults(store: Arc<BrickStore>, faults: Arc<ServerFaults>) -> BrickService {
        BrickService {
            store,
            faults,
            metrics: BrickMetrics::new(""),
        }
    }

    /// Counts and times the calls it answers in `metrics` (registered by the caller).
    pub fn with_metrics(store: Arc<BrickStore>, metrics: BrickMetrics) -> BrickService {
        BrickService {
            metrics,
            ..Self::new(store)
        }
    }

    /// Answers a call, and counts it: its kind, how long it took, the error it ended with.
    async fn metered<T>(
        &self,
        kind: RpcKind,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let answer = call.await;
        let error = answer.as_ref().err().map(Status::code);
        self.metrics.answered(kind, started.elapsed(), error);
        answer.map(Response::new)
    }
}

/// Serves the brick on `listener` until `shutdown` completes.
pub async fn serve(
    store: Arc<BrickStore>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_service(BrickService::new(store), listener, shutdown).await
}

/// [`serve`], with test-only faults.
#[doc(hidden)]
pub async fn serve_with_faults(
    store: Arc<BrickStore>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    faults: Arc<ServerFaults>,
) -> Result<(), tonic::transport::Error> {
    serve_service(BrickService::with_faults(store, faults), listener, shutdown).await
}

/// Serves `service` (a brick, with its faults and metrics) on `listener` until `shutdown`
/// completes.
pub async fn serve_service(
    service: BrickService,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let disk = service.store.clone();
    let service = by_reference::ReceiveByReference(
        brick_server::BrickServer::new(service)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
    );
    // A brick whose disk failed answers as one that is down, to every request: hosts take it
    // down and go on with its peers (`failstop`).
    let service = tonic::service::interceptor::InterceptedService::new(
        service,
        move |request: Request<()>| match disk.disk_failure() {
            Some(failure) => Err(Status::unavailable(format!(
                "the brick's disk failed ({failure}); it serves nothing until restarted or replaced"
            ))),
            None => Ok(request),
        },
    );
    tonic::transport::Server::builder()
        .initial_stream_window_size(super::STREAM_WINDOW)
        .initial_connection_window_size(super::CONNECTION_WINDOW)
        .max_frame_size(super::MAX_FRAME)
        .add_service(service)
        // Without TCP_NODELAY a reply's small frames wait for the client's delayed ACK
        // (40 ms on Linux) behind a 1 MiB request: measured as 44 to 48 ms medians per prepare
        // and commit at 4 outstanding intervals (`commit_overhead`).
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}

/// How long a read waits for an undecided interval over its bytes (`BrickStore::until_decided`)
/// before it is refused: a commit on its way takes milliseconds; an interval whose client died
/// waits for its lease to run out, seconds, and a host's read must not wait out its own
/// deadline (it would take the brick for unreachable).
const UNDECIDED_READ_WAIT: Duration = Duration::from_millis(500);

/// A store error as the gRPC status a client can act on, logged: a bad request is the
/// client's to fix, damage and I/O errors the operator's.
fn refuse(what: &str, error: BlockError) -> Status {
    let message = format!("{what}: {error}");
    match &error {
        BlockError::InvalidArgument(_) | BlockError::TooLarge { .. } => {
            tracing::warn!(%message, "brick request refused");
            Status::invalid_argument(message)
        }
        // The share has no free unit left: the brick is full, not failed (a full disk under
        // its file fails it, and the interceptor answers from then on).
        BlockError::NoSpace => Status::resource_exhausted(message),
        BlockError::OutOfRange { .. } => {
            tracing::warn!(%message, "brick request refused");
            Status::out_of_range(message)
        }
        BlockError::Shutdown => Status::unavailable(message),
        // Not built (the store's versions before its mapped format), or refused by its rules
        // (a roll-back while intervals are in doubt): answered, nothing applied.
        BlockError::Unsupported(_) => {
            tracing::warn!(%message, "brick request refused");
            Status::failed_precondition(message)
        }
        BlockError::Corrupt(_) => {
            tracing::error!(%message, "brick damaged");
            Status::data_loss(message)
        }
        // The disk failed under the brick (`failstop`): answered as a brick that is down, so
        // that hosts go on with its peers. Whether the request was applied is unknown.
        BlockError::Io { .. } => {
            tracing::error!(%message, "brick request failed");
            Status::unavailable(message)
        }
        _ => {
            tracing::error!(%message, "brick request failed");
            Status::internal(message)
        }
    }
}

/// Runs a request that changes the store as a task of its own: when a client gives up and
/// its stream is reset, the server drops the handler, and a store operation dropped halfway
/// (staging taken, record not yet made) would be left for the next restart to tidy.
async fn to_completion<T: Send + 'static>(
    work: impl std::future::Future<Output = strata_core::Result<T>> + Send + 'static,
) -> strata_core::Result<T> {
    tokio::spawn(work).await.unwrap_or_else(|join| {
        Err(BlockError::Io {
            context: "brick request".into(),
            source: std::io::Error::other(join.to_string()),
        })
    })
}

fn interval(id: Option<proto::Interval>) -> Result<IntervalId, Status> {
    let id = id.ok_or_else(|| Status::invalid_argument("no interval id"))?;
    Ok(IntervalId {
        client: id.client,
        seq: id.seq,
    })
}

/// A read longer than a message can carry, refused before it is made.
fn check_read_len(what: &str, len: u32) -> Result<(), Status> {
    if len as usize > MAX_MESSAGE {
        return Err(refuse(
            what,
            BlockError::TooLarge {
                len: u64::from(len),
                max: MAX_MESSAGE as u64,
            },
        ));
    }
    Ok(())
}

#[tonic::async_trait]
impl brick_server::Brick for BrickService {
    async fn prepare(
        &self,
        request: Request<proto::PrepareRequest>,
    ) -> Result<Response<proto::PrepareReply>, Status> {
        self.metered(RpcKind::Prepare, async {
            let request = by_reference::received(request);
            let id = interval(request.id)?;
            let _open = self.faults.prepare_open();
            let delay = (self.faults.prepare_delay_ms).load(std::sync::atomic::Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let bytes: usize = request.writes.iter().map(|w| w.data.len()).sum();
            let writes = request
                .writes
                .into_iter()
                .map(|w| (w.offset, w.data))
                .collect();
            let fences: Vec<(u32, i64)> = request
                .fences
                .iter()
                .map(|f| (f.segment, f.epoch))
                .collect();
            let carried = (request.commits.iter())
                .map(|c| interval(Some(*c)))
                .collect::<Result<Vec<_>, Status>>()?;
            let store = self.store.clone();
            let tag = request.tag;
            let (vote, committed) = to_completion(async move {
                (store.prepare_carrying(&carried, id, request.bricks, writes, &fences, tag)).await
            })
            .await
            .map_err(|e| refuse("prepare", e))?;
            let applied = committed.iter().filter(|&&c| c).count() as u64;
            if applied > 0 {
                self.metrics.carried(applied);
            }
            for _ in applied..committed.len() as u64 {
                self.metrics.decision_refused(RpcKind::Commit);
            }
            Ok(match vote {
                Vote::Yes => {
                    self.metrics.moved(RpcKind::Prepare, bytes as u64);
                    proto::PrepareReply {
                        yes: true,
                        reason: String::new(),
                        committed,
                    }
                }
                Vote::No(reason) => proto::PrepareReply {
                    yes: false,
                    reason,
                    committed,
                },
            })
        })
        .await
    }

    async fn decide(
        &self,
        request: Request<proto::DecideRequest>,
    ) -> Result<Response<proto::DecideReply>, Status> {
        let request = request.into_inner();
        let (kind, decision) = match proto::Decision::try_from(request.decision) {
            Ok(proto::Decision::Commit) => (RpcKind::Commit, Some(Decision::Commit)),
            Ok(proto::Decision::Abort) => (RpcKind::Abort, Some(Decision::Abort)),
            _ => (RpcKind::Decide, None),
        };
        self.metered(kind, async {
            let id = interval(request.id)?;
            let Some(decision) = decision else {
                tracing::warn!(?id, decision = request.decision, "brick request refused");
                return Err(Status::invalid_argument(format!(
                    "decide: no decision ({})",
                    request.decision
                )));
            };
            if (self.faults.swallow_decisions).load(std::sync::atomic::Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            let jitter = (self.faults.decide_jitter_ms).load(std::sync::atomic::Ordering::SeqCst);
            if jitter > 0 {
                // Any spread will do: decisions sent at once then reach the bricks in
                // different orders.
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                let wait = std::time::Duration::from_micros(u64::from(nanos) % (jitter * 1000));
                tokio::time::sleep(wait).await;
            }
            let store = self.store.clone();
            let accepted = to_completion(async move {
                if request.resolution {
                    store.decide_resolved(id, decision).await
                } else {
                    store.decide(id, decision).await
                }
            })
            .await
            .map_err(|e| refuse("decide", e))?;
            if !accepted {
                self.metrics.decision_refused(kind);
            }
            Ok(proto::DecideReply { accepted })
        })
        .await
    }

    async fn status(
        &self,
        request: Request<proto::Interval>,
    ) -> Result<Response<proto::StatusReply>, Status> {
        self.metered(RpcKind::Status, async {
            let id = interval(Some(request.into_inner()))?;
            let status = self
                .store
                .try_status(id)
                .await
                .map_err(|e| refuse("status", e))?;
            let state = match status {
                None => proto::State::Unknown,
                Some(IntervalStatus::Prepared) => proto::State::Prepared,
                Some(IntervalStatus::Decided(Decision::Commit)) => proto::State::Committed,
                Some(IntervalStatus::Decided(Decision::Abort)) => proto::State::Aborted,
            };
            Ok(proto::StatusReply {
                state: state as i32,
            })
        })
        .await
    }

    async fn in_doubt(
        &self,
        _request: Request<proto::Empty>,
    ) -> Result<Response<proto::InDoubtReply>, Status> {
        self.metered(RpcKind::InDoubt, async {
            let intervals = self
                .store
                .try_in_doubt_tagged()
                .await
                .map_err(|e| refuse("in doubt", e))?
                .into_iter()
                .map(|(id, bricks, tag)| proto::InDoubt {
                    id: Some(proto::Interval {
                        client: id.client,
                        seq: id.seq,
                    }),
                    bricks,
                    tag,
                })
                .collect();
            Ok(proto::InDoubtReply { intervals })
        })
        .await
    }

    async fn forget(
        &self,
        request: Request<proto::ForgetRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        self.metered(RpcKind::Forget, async {
            let request = request.into_inner();
            let store = self.store.clone();
            to_completion(async move { store.forget(request.client, request.below).await })
                .await
                .map_err(|e| refuse("forget", e))?;
            Ok(proto::Empty {})
        })
        .await
    }

    async fn fence_client(
        &self,
        request: Request<proto::FenceClientRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        self.metered(RpcKind::FenceClient, async {
            let store = self.store.clone();
            let client = request.into_inner().client;
            to_completion(async move { store.fence_client(client).await })
                .await
                .map_err(|e| refuse("fence client", e))?;
            Ok(proto::Empty {})
        })
        .await
    }

    async fn write_direct(
        &self,
        request: Request<proto::WriteDirectRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        self.metered(RpcKind::WriteDirect, async {
            let writes = by_reference::received(request)
                .writes
                .into_iter()
                .map(|w| (w.offset, w.data))
                .collect();
            self.store
                .write_direct(writes)
                .await
                .map_err(|e| refuse("write", e))?;
            Ok(proto::Empty {})
        })
        .await
    }

    async fn read(
        &self,
        request: Request<proto::ReadRequest>,
    ) -> Result<Response<proto::ReadReply>, Status> {
        self.metered(RpcKind::Read, async {
            let request = request.into_inner();
            check_read_len("read", request.len)?;
            let (offset, len) = (request.offset, u64::from(request.len));
            if (tokio::time::timeout(UNDECIDED_READ_WAIT, self.store.until_decided(offset, len)))
                .await
                .is_err()
            {
                let held = self.store.undecided_over(offset, len);
                tracing::warn!(
                    offset,
                    len,
                    ?held,
                    "read refused: an undecided interval holds it"
                );
                return Err(Status::failed_precondition(format!(
                    "read refused: bytes {offset}..{} are held by interval {held:?}, prepared here \
                     and undecided after {UNDECIDED_READ_WAIT:?}: its client's decision, or the \
                     bricks' resolution once its lease ran out, frees them",
                    offset + len
                )));
            }
            let data = self
                .store
                .read(request.offset, request.len as usize)
                .await
                .map_err(|e| refuse("read", e))?;
            self.metrics.moved(RpcKind::Read, data.len() as u64);
            Ok(proto::ReadReply {
                data: data.freeze(),
            })
        })
        .await
    }

    async fn versions(
        &self,
        _request: Request<proto::Empty>,
    ) -> Result<Response<proto::VersionsReply>, Status> {
        self.metered(RpcKind::Versions, async {
            let versions = (self.store.versions().await)
                .map_err(|e| refuse("versions", e))?
                .into_iter()
                .map(Into::into)
                .collect();
            Ok(proto::VersionsReply { versions })
        })
        .await
    }

    async fn seal_version(
        &self,
        request: Request<proto::VersionRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        self.metered(RpcKind::SealVersion, async {
            let number = request.into_inner().number;
            let store = self.store.clone();
            to_completion(async move { store.seal_version(number).await })
                .await
                .map_err(|e| refuse("seal version", e))?;
            Ok(proto::Empty {})
        })
        .await
    }

    async fn delete_version(
        &self,
        request: Request<proto::VersionRequest>,
    ) -> Result<Response<proto::DeleteVersionReply>, Status> {
        self.metered(RpcKind::DeleteVersion, async {
            let number = request.into_inner().number;
            let store = self.store.clone();
            let deleted = to_completion(async move { store.delete_version(number).await })
                .await
                .map_err(|e| refuse("delete version", e))?;
            Ok(proto::DeleteVersionReply { deleted })
        })
        .await
    }

    async fn rollback(
        &self,
        request: Request<proto::RollbackRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        self.metered(RpcKind::Rollback, async {
            let proto::RollbackRequest { number, spent } = request.into_inner();
            let store = self.store.clone();
            to_completion(async move { store.rollback(number, spent).await })
                .await
                .map_err(|e| refuse("rollback", e))?;
            Ok(proto::Empty {})
        })
        .await
    }

    async fn read_version(
        &self,
        request: Request<proto::ReadVersionRequest>,
    ) -> Result<Response<proto::ReadReply>, Status> {
        self.metered(RpcKind::ReadVersion, async {
            let request = request.into_inner();
            check_read_len("read version", request.len)?;
            let data = self
                .store
                .read_version(request.number, request.offset, request.len as usize)
                .await
                .map_err(|e| refuse("read version", e))?;
            self.metrics.moved(RpcKind::ReadVersion, data.len() as u64);
            Ok(proto::ReadReply {
                data: data.freeze(),
            })
        })
        .await
    }

    async fn describe(
        &self,
        _request: Request<proto::Empty>,
    ) -> Result<Response<proto::DescribeReply>, Status> {
        self.metered(RpcKind::Describe, async {
            Ok(wire::to_reply(self.store.summary()))
        })
        .await
    }
}
