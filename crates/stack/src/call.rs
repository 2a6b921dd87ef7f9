//! A layer's own verbs, called by name: `strata call LAYER VERB [ARG=VALUE]…`.
//!
//! A kind declares its verbs in its registry entry (name, typed arguments, help). The verbs
//! that change the stack's graph or its exports (replace, add-member, grow, volume-create…)
//! run as plans through `reconfig` and `volumes`, and have commands of their own. Every other
//! declared verb is the layer's business alone: it records what it changes in its own
//! metadata, so the control plane only checks the arguments against the declaration, routes
//! the call to the layer that declares the verb (down through filters), and hands back the
//! layer's answer. A new verb is then one line in the kind's entry and one arm in its
//! `control`, with no edit here, in the admin socket or in the command line.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use strata_core::{Control, ControlReply};

use crate::build::NodeKind;
use crate::control::ControlPlane;
use crate::reconfig::route_verb;
use crate::registry;
use crate::volumes;

/// A call as the admin socket carries it.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Call {
    /// The layer the call is sent to (a filter above the handler will do).
    pub layer: String,
    pub verb: String,
    /// `name=value` pairs as given; a bare flag has no value.
    pub args: Vec<(String, Option<String>)>,
}

/// Verbs the control plane runs itself (they change the graph, the config or the exports),
/// with the command that does.
const PLANNED: &[(&str, &str)] = &[
    ("replace", "strata replace"),
    ("add-member", "strata add-member"),
    ("fail-member", "strata fail-member"),
    ("grow", "strata grow"),
    ("grow-pool", "strata grow-pool"),
    (strata_core::layer::CREATE_VOLUME, "strata volume create"),
    ("volume-list", "strata volume list"),
    ("volume-resize", "strata volume resize"),
    ("volume-delete", "strata volume delete"),
];

/// Runs `call` on the running stack and returns the layer's answer as JSON.
pub async fn call(plane: &ControlPlane, call: Call) -> anyhow::Result<serde_json::Value> {
    if let Some((_, command)) = PLANNED.iter().find(|(verb, _)| *verb == call.verb) {
        bail!(
            "{} changes the stack itself and runs as a plan: use `{command}`",
            call.verb
        );
    }
    // Routed under the reconfiguration lock, so the graph cannot change under the routing.
    let reconfig = plane.reconfig.lock().await;
    let target = route_verb(&reconfig.loaded, &call.layer, &call.verb)?;
    let kind = reconfig
        .loaded
        .layers
        .iter()
        .find(|layer| layer.name == target)
        .and_then(|layer| registry::find(&layer.kind))
        .with_context(|| format!("layer {target} has no kind in the registry"))?;
    let verb = kind
        .verb(&call.verb)
        .with_context(|| format!("{} declares no verb {:?}", kind.kind, call.verb))?;
    let args = verb
        .arguments(&call.args)
        .map_err(|e| anyhow::anyhow!("{target}: {e} (usage: {})", verb.usage()))?;
    let node = plane
        .nodes()
        .into_iter()
        .find(|node| node.name == target)
        .with_context(|| format!("layer {target} is not running (see `strata status`)"))?;
    tracing::info!(layer = %target, verb = %call.verb, ?args, "verb called");
    // The lock stays held through the call only for a pool, whose exports follow what its
    // verb did. Any other verb may run long (a stage's destage): holding the lock would stall
    // `strata status`, which takes it too, for as long. The node is routed and held, so a
    // change of the graph meanwhile cannot take it from under the call.
    let mut reconfig = matches!(node.kind, NodeKind::Maker(_)).then_some(reconfig);
    let reply = node
        .control_device()
        .control(Control::Call {
            verb: call.verb.clone(),
            args,
        })
        .await;
    match reply {
        Ok(ControlReply::Table(table)) => {
            let mut answer = serde_json::to_value(table).context("the layer's answer")?;
            // A pool's verb may have made a volume (a clone) or ended a device (a deleted
            // snapshot): its exports follow.
            if let Some(reconfig) = reconfig.as_mut() {
                let said = volumes::reconcile(plane, reconfig, &target).await?;
                if !said.is_empty() {
                    answer["exports"] = serde_json::json!(said);
                }
            }
            Ok(answer)
        }
        Ok(_) => bail!(
            "{target} answered {} with something other than a table",
            call.verb
        ),
        Err(error) => {
            tracing::warn!(layer = %target, verb = %call.verb, %error, "verb refused");
            Err(anyhow::Error::new(error).context(format!("{target}: {}", call.verb)))
        }
    }
}
