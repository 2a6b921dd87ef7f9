//! The brick service: a [`BrickStore`] answering the transaction channel.

use std::future::Future;
use std::sync::Arc;

use strata_cluster::interval::{Decision, IntervalId, Status as IntervalStatus};
use strata_core::BlockError;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use super::proto::{self, brick_server};
use super::MAX_MESSAGE;
use crate::store::{BrickStore, Vote};

pub struct BrickService {
    store: Arc<BrickStore>,
    faults: Arc<ServerFaults>,
}

/// Test-only faults of a brick server, switched on and off while it runs.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct ServerFaults {
    /// Decisions are taken in and never answered nor applied: a brick that voted, then died
    /// before it heard the decision.
    pub swallow_decisions: std::sync::atomic::AtomicBool,
}

impl BrickService {
    pub fn new(store: Arc<BrickStore>) -> BrickService {
        Self::with_faults(store, Arc::default())
    }

    #[doc(hidden)]
    pub fn with_faults(store: Arc<BrickStore>, faults: Arc<ServerFaults>) -> BrickService {
        BrickService { store, faults }
    }
}

/// Serves the brick on `listener` until `shutdown` completes.
pub async fn serve(
    store: Arc<BrickStore>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with_faults(store, listener, shutdown, Arc::default()).await
}

/// [`serve`], with test-only faults.
#[doc(hidden)]
pub async fn serve_with_faults(
    store: Arc<BrickStore>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
    faults: Arc<ServerFaults>,
) -> Result<(), tonic::transport::Error> {
    let disk = store.clone();
    let service = brick_server::BrickServer::new(BrickService::with_faults(store, faults))
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
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
        .add_service(service)
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await
}

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

#[tonic::async_trait]
impl brick_server::Brick for BrickService {
    async fn prepare(
        &self,
        request: Request<proto::PrepareRequest>,
    ) -> Result<Response<proto::PrepareReply>, Status> {
        let request = request.into_inner();
        let id = interval(request.id)?;
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
        let store = self.store.clone();
        let tag = request.tag;
        let vote = to_completion(async move {
            (store.prepare_tagged(id, request.bricks, writes, &fences, tag)).await
        })
        .await
        .map_err(|e| refuse("prepare", e))?;
        Ok(Response::new(match vote {
            Vote::Yes => proto::PrepareReply {
                yes: true,
                reason: String::new(),
            },
            Vote::No(reason) => proto::PrepareReply { yes: false, reason },
        }))
    }

    async fn decide(
        &self,
        request: Request<proto::DecideRequest>,
    ) -> Result<Response<proto::DecideReply>, Status> {
        let request = request.into_inner();
        let id = interval(request.id)?;
        let decision = match proto::Decision::try_from(request.decision) {
            Ok(proto::Decision::Commit) => Decision::Commit,
            Ok(proto::Decision::Abort) => Decision::Abort,
            _ => {
                tracing::warn!(?id, decision = request.decision, "brick request refused");
                return Err(Status::invalid_argument(format!(
                    "decide: no decision ({})",
                    request.decision
                )));
            }
        };
        if (self.faults.swallow_decisions).load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
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
        Ok(Response::new(proto::DecideReply { accepted }))
    }

    async fn status(
        &self,
        request: Request<proto::Interval>,
    ) -> Result<Response<proto::StatusReply>, Status> {
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
        Ok(Response::new(proto::StatusReply {
            state: state as i32,
        }))
    }

    async fn in_doubt(
        &self,
        _request: Request<proto::Empty>,
    ) -> Result<Response<proto::InDoubtReply>, Status> {
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
        Ok(Response::new(proto::InDoubtReply { intervals }))
    }

    async fn forget(
        &self,
        request: Request<proto::ForgetRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let request = request.into_inner();
        let store = self.store.clone();
        to_completion(async move { store.forget(request.client, request.below).await })
            .await
            .map_err(|e| refuse("forget", e))?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn fence_client(
        &self,
        request: Request<proto::FenceClientRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let store = self.store.clone();
        let client = request.into_inner().client;
        to_completion(async move { store.fence_client(client).await })
            .await
            .map_err(|e| refuse("fence client", e))?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn write_direct(
        &self,
        request: Request<proto::WriteDirectRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let writes = request
            .into_inner()
            .writes
            .into_iter()
            .map(|w| (w.offset, w.data))
            .collect();
        self.store
            .write_direct(writes)
            .await
            .map_err(|e| refuse("write", e))?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn read(
        &self,
        request: Request<proto::ReadRequest>,
    ) -> Result<Response<proto::ReadReply>, Status> {
        let request = request.into_inner();
        if request.len as usize > MAX_MESSAGE {
            return Err(refuse(
                "read",
                BlockError::TooLarge {
                    len: u64::from(request.len),
                    max: MAX_MESSAGE as u64,
                },
            ));
        }
        let data = self
            .store
            .read(request.offset, request.len as usize)
            .await
            .map_err(|e| refuse("read", e))?;
        Ok(Response::new(proto::ReadReply {
            data: data.freeze(),
        }))
    }

    async fn versions(
        &self,
        _request: Request<proto::Empty>,
    ) -> Result<Response<proto::VersionsReply>, Status> {
        let versions = (self.store.versions().await)
            .map_err(|e| refuse("versions", e))?
            .into_iter()
            .map(|v| proto::VersionInfo {
                number: v.number,
                held_bytes: v.held_bytes,
            })
            .collect();
        Ok(Response::new(proto::VersionsReply { versions }))
    }

    async fn seal_version(
        &self,
        request: Request<proto::VersionRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let number = request.into_inner().number;
        let store = self.store.clone();
        to_completion(async move { store.seal_version(number).await })
            .await
            .map_err(|e| refuse("seal version", e))?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn delete_version(
        &self,
        request: Request<proto::VersionRequest>,
    ) -> Result<Response<proto::DeleteVersionReply>, Status> {
        let number = request.into_inner().number;
        let store = self.store.clone();
        let deleted = to_completion(async move { store.delete_version(number).await })
            .await
            .map_err(|e| refuse("delete version", e))?;
        Ok(Response::new(proto::DeleteVersionReply { deleted }))
    }

    async fn rollback(
        &self,
        request: Request<proto::RollbackRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let proto::RollbackRequest { number, spent } = request.into_inner();
        let store = self.store.clone();
        to_completion(async move { store.rollback(number, spent).await })
            .await
            .map_err(|e| refuse("rollback", e))?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn read_version(
        &self,
        request: Request<proto::ReadVersionRequest>,
    ) -> Result<Response<proto::ReadReply>, Status> {
        let request = request.into_inner();
        if request.len as usize > MAX_MESSAGE {
            return Err(refuse(
                "read version",
                BlockError::TooLarge {
                    len: u64::from(request.len),
                    max: MAX_MESSAGE as u64,
                },
            ));
        }
        let data = self
            .store
            .read_version(request.number, request.offset, request.len as usize)
            .await
            .map_err(|e| refuse("read version", e))?;
        Ok(Response::new(proto::ReadReply {
            data: data.freeze(),
        }))
    }
}
