//! A minimal HTTP listener for Prometheus: `GET /metrics` and nothing else. Prometheus only
//! needs this much, and a full HTTP stack would be most of the binary. It serves whatever
//! holds a registry: `strata serve`'s admin state, or a brick's own registry.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use crate::admin::AdminState;

const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// What the listener renders: the registry of the process it serves.
pub trait Scraped: Send + Sync + 'static {
    fn registry(&self) -> &Registry;
}

impl Scraped for AdminState {
    fn registry(&self) -> &Registry {
        &self.registry
    }
}

impl Scraped for Registry {
    fn registry(&self) -> &Registry {
        self
    }
}

pub async fn run<S: Scraped>(listener: TcpListener, state: Arc<S>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let state = state.clone();
                tokio::spawn(async move {
                    let answered =
                        tokio::time::timeout(Duration::from_secs(10), answer(stream, &*state));
                    if let Ok(Err(e)) = answered.await {
                        debug!("metrics request failed: {e}");
                    }
                });
            }
            Err(e) => {
                warn!("metrics accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, state: &impl Scraped) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || head.len() + n > MAX_REQUEST_HEAD {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let request_line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let (status, content_type, body) = if request_line.starts_with(b"GET /metrics ") {
        let mut text = String::new();
        match prometheus_client::encoding::text::encode(&mut text, state.registry()) {
            Ok(()) => (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                text,
            ),
            Err(e) => ("500 Internal Server Error", "text/plain", e.to_string()),
        }
    } else {
        ("404 Not Found", "text/plain", "try /metrics\n".to_string())
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
