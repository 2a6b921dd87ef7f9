//! Online changes as plans: a plan is a list of steps, each of which knows how to take back
//! what it did. Applying runs the steps in order; when one fails, the steps already applied
//! are undone, last first, and the error names the step that failed.
//!
//! Some steps cannot be taken back: once a layer has been told to use a new member, its own
//! metadata records it, and pretending otherwise would leave the server's view behind the
//! layer's. Such a step is a point of no return: when it succeeds, the steps before it are
//! kept whatever happens later (a later failure then undoes only the steps after it).

use async_trait::async_trait;
use strata_core::lifecycle::while_quiesced;
use strata_core::DeviceRef;

/// One step of a plan over the state `S` it changes.
#[async_trait]
pub trait Step<S: Send>: Send {
    /// What the step does ("label disk d3", "record the config"), for errors and the log.
    fn describe(&self) -> String;

    async fn apply(&mut self, state: &mut S) -> anyhow::Result<()>;

    /// Takes back what `apply` did. Called only after `apply` succeeded; an error here is
    /// logged, and the rollback goes on with the steps before.
    async fn undo(&mut self, _state: &mut S) -> anyhow::Result<()> {
        Ok(())
    }

    /// False for a point of no return (see the module comment).
    fn reversible(&self) -> bool {
        true
    }
}

/// `step` run with `device`'s background work (rebuild, resync, committer) quiesced, and
/// resumed afterwards whatever the step returns: the one path by which an online change
/// keeps a layer's background work from running under it. A layer with no background work
/// just runs the step.
pub struct Quiesced<T> {
    device: DeviceRef,
    step: T,
}

impl<T> Quiesced<T> {
    pub fn new(device: DeviceRef, step: T) -> Self {
        Quiesced { device, step }
    }
}

#[async_trait]
impl<S: Send, T: Step<S>> Step<S> for Quiesced<T> {
    fn describe(&self) -> String {
        self.step.describe()
    }

    async fn apply(&mut self, state: &mut S) -> anyhow::Result<()> {
        while_quiesced(&self.device, self.step.apply(state)).await?
    }

    async fn undo(&mut self, state: &mut S) -> anyhow::Result<()> {
        while_quiesced(&self.device, self.step.undo(state)).await?
    }

    fn reversible(&self) -> bool {
        self.step.reversible()
    }
}

/// Steps to apply in order.
pub struct Plan<S> {
    steps: Vec<Box<dyn Step<S>>>,
}

impl<S: Send> Default for Plan<S> {
    fn default() -> Self {
        Plan { steps: Vec::new() }
    }
}

impl<S: Send> Plan<S> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `step` after the others.
    pub fn then(mut self, step: impl Step<S> + 'static) -> Self {
        self.steps.push(Box::new(step));
        self
    }

    /// Adds `step` after the others when there is one.
    pub fn then_some(self, step: Option<impl Step<S> + 'static>) -> Self {
        match step {
            Some(step) => self.then(step),
            None => self,
        }
    }

    /// What the plan would do, step by step.
    pub fn describe(&self) -> Vec<String> {
        self.steps.iter().map(|s| s.describe()).collect()
    }

    /// Runs every step; on a failure, undoes the applied steps (back to the last point of no
    /// return) and returns the failure.
    pub async fn apply(self, state: &mut S) -> anyhow::Result<()> {
        let mut applied: Vec<Box<dyn Step<S>>> = Vec::new();
        for mut step in self.steps {
            match step.apply(state).await {
                Ok(()) if step.reversible() => applied.push(step),
                Ok(()) => applied.clear(),
                Err(error) => {
                    let error = error.context(step.describe());
                    for mut done in applied.into_iter().rev() {
                        if let Err(e) = done.undo(state).await {
                            tracing::error!(
                                "rolling back: could not undo \"{}\": {e:#}",
                                done.describe()
                            );
                        }
                    }
                    return Err(error);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Appends its number to the log when applied, removes it when undone; fails if asked.
    struct Record {
        number: u32,
        fails: bool,
        reversible: bool,
    }

    fn record(number: u32) -> Record {
        Record {
            number,
            fails: false,
            reversible: true,
        }
    }

    #[async_trait]
    impl Step<Vec<u32>> for Record {
        fn describe(&self) -> String {
            format!("step {}", self.number)
        }

        async fn apply(&mut self, log: &mut Vec<u32>) -> anyhow::Result<()> {
            if self.fails {
                anyhow::bail!("refused");
            }
            log.push(self.number);
            Ok(())
        }

        async fn undo(&mut self, log: &mut Vec<u32>) -> anyhow::Result<()> {
            assert_eq!(log.pop(), Some(self.number), "undone last first");
            Ok(())
        }

        fn reversible(&self) -> bool {
            self.reversible
        }
    }

    fn run(plan: Plan<Vec<u32>>) -> (Vec<u32>, Option<String>) {
        let mut log = Vec::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let result = runtime.block_on(plan.apply(&mut log));
        (log, result.err().map(|e| format!("{e:#}")))
    }

    #[test]
    fn every_step_applies_in_order() {
        let plan = Plan::new().then(record(1)).then(record(2)).then(record(3));
        assert_eq!(plan.describe(), ["step 1", "step 2", "step 3"]);
        assert_eq!(run(plan), (vec![1, 2, 3], None));
    }

    #[test]
    fn a_failure_undoes_the_applied_steps_and_names_the_step() {
        let failing = Record {
            fails: true,
            ..record(3)
        };
        let plan = Plan::new()
            .then(record(1))
            .then(record(2))
            .then(failing)
            .then(record(4));
        assert_eq!(run(plan), (vec![], Some("step 3: refused".to_string())));
    }

    /// A layer that logs the lifecycle verbs it is sent into the plan's log (as 100 + verb).
    struct Layer(std::sync::Arc<std::sync::Mutex<Vec<u32>>>);

    #[async_trait]
    impl strata_core::BlockDevice for Layer {
        fn geometry(&self) -> strata_core::Geometry {
            strata_core::Geometry::byte_addressable(4096)
        }
        fn capabilities(&self) -> strata_core::Capabilities {
            strata_core::Capabilities::default()
        }
        async fn read(&self, _offset: u64, len: usize) -> strata_core::Result<bytes::BytesMut> {
            Ok(bytes::BytesMut::zeroed(len))
        }
        async fn write(
            &self,
            _offset: u64,
            _data: bytes::Bytes,
            _flags: strata_core::WriteFlags,
        ) -> strata_core::Result<()> {
            Ok(())
        }
        async fn flush(&self) -> strata_core::Result<()> {
            Ok(())
        }
        async fn control(
            &self,
            request: strata_core::Control,
        ) -> strata_core::Result<strata_core::ControlReply> {
            let code = match request {
                strata_core::Control::Quiesce => 101,
                strata_core::Control::Resume => 102,
                other => return Err(strata_core::refuse(&other)),
            };
            self.0.lock().unwrap().push(code);
            Ok(strata_core::ControlReply::Done)
        }
    }

    #[test]
    fn a_quiesced_step_runs_between_quiesce_and_resume_even_when_it_fails() {
        let verbs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let layer: DeviceRef = std::sync::Arc::new(Layer(verbs.clone()));
        let failing = Record {
            fails: true,
            ..record(2)
        };
        let plan = Plan::new()
            .then(Quiesced::new(layer.clone(), record(1)))
            .then(Quiesced::new(layer, failing));
        assert_eq!(plan.describe(), ["step 1", "step 2"]);
        assert_eq!(run(plan), (vec![], Some("step 2: refused".to_string())));
        // Step 1 applied, step 2 failed, step 1 undone: each under its own quiesce.
        assert_eq!(
            *verbs.lock().unwrap(),
            [101, 102, 101, 102, 101, 102],
            "every quiesce is resumed"
        );
    }

    #[test]
    fn a_point_of_no_return_keeps_the_steps_before_it() {
        let no_return = Record {
            reversible: false,
            ..record(2)
        };
        let failing = Record {
            fails: true,
            ..record(4)
        };
        let plan = Plan::new()
            .then(record(1))
            .then(no_return)
            .then(record(3))
            .then(failing);
        assert_eq!(run(plan), (vec![1, 2], Some("step 4: refused".to_string())));
    }
}
