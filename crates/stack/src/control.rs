//! The running stack as the control plane sees it: its nodes, its exports, the NBD server
//! whose clients they have, and the reconfiguration state behind one lock. The admin socket
//! (in the binary) is only its transport.

use std::sync::Arc;

use strata_nbd::{Exports, Server};

use crate::build::{Node, Refused};
use crate::reconfig::{Change, Reconfig};

pub struct ControlPlane {
    pub server: Arc<Server>,
    pub exports: Arc<Exports>,
    /// The stack's nodes; reconfiguration adds and removes some.
    pub nodes: std::sync::Mutex<Vec<Node>>,
    /// Devices that did not start (and everything above them), with why.
    pub refused: Vec<Refused>,
    pub reconfig: tokio::sync::Mutex<Reconfig>,
}

impl ControlPlane {
    pub fn nodes(&self) -> Vec<Node> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the node list (a change added or removed nodes).
    pub fn set_nodes(&self, nodes: Vec<Node>) {
        *self.nodes.lock().unwrap_or_else(|p| p.into_inner()) = nodes;
    }

    /// Applies one reconfiguration, serialized with any other.
    pub async fn change(&self, change: Change) -> anyhow::Result<String> {
        let mut reconfig = self.reconfig.lock().await;
        let mut nodes = self.nodes();
        tracing::info!(?change, "reconfiguration requested");
        let result = reconfig.apply(change, &mut nodes).await;
        self.set_nodes(nodes);
        match &result {
            Ok(summary) => tracing::info!(%summary, "reconfiguration done"),
            Err(e) => tracing::warn!("reconfiguration refused: {e:#}"),
        }
        result
    }
}
