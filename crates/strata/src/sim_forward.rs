//! `strata sim …` runs the simulator, which is a separate executable (`strata-sim`, built from
//! crates/sim) so that the serving binary does not contain the simulator's models, plots and
//! trace readers. It is looked for next to this executable, then on PATH.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::ExitCode;

const SIMULATOR: &str = "strata-sim";

/// Replaces this process with `strata-sim ARGS…`; returns only if that cannot start.
pub fn run(args: &[OsString]) -> anyhow::Result<ExitCode> {
    let program = simulator();
    let error = std::process::Command::new(&program).args(args).exec();
    anyhow::bail!(
        "cannot run the simulator {}: {error} (build it with `cargo build --release -p strata-sim`)",
        program.display()
    )
}

fn simulator() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(SIMULATOR)))
        .filter(|sibling| sibling.is_file())
        .unwrap_or_else(|| PathBuf::from(SIMULATOR))
}
