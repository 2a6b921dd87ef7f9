//! `strata lock EXPORT OFFSET LEN -- COMMAND…`: runs a command while holding a byte-range
//! lock of an export, as flock(1) does for a file. The lock is a session on the server's
//! admin socket (`lock_session`); it is released when the command ends, or when this
//! process dies (its connection closes).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use strata_core::{errln, ByteSize};

#[derive(clap::Args)]
pub struct LockArgs {
    /// The export to lock a range of.
    pub export: String,
    /// Where the range starts (bytes, or with a unit: 4KiB).
    pub offset: String,
    /// Its length.
    pub len: String,
    /// A shared (reader's) lock instead of an exclusive one.
    #[arg(long)]
    pub shared: bool,
    /// The command to run while the lock is held; it should flush what it wrote before it
    /// ends (its NBD connection's writes are committed by its flush, not by the unlock).
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// A lock session on a server's admin socket.
struct Session {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Session {
    fn open(socket: &Path) -> anyhow::Result<Session> {
        let stream = UnixStream::connect(socket).with_context(|| {
            format!(
                "cannot reach the admin socket {} (is `strata serve` running?)",
                socket.display()
            )
        })?;
        let mut session = Session {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        };
        session.send(&serde_json::json!({ "cmd": "lock-session" }))?;
        Ok(session)
    }

    fn send(&mut self, request: &serde_json::Value) -> anyhow::Result<()> {
        self.writer.write_all(format!("{request}\n").as_bytes())?;
        Ok(())
    }

    fn ask(&mut self, request: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
        self.send(request)?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            anyhow::bail!("the server closed the lock session");
        }
        let reply: serde_json::Value =
            serde_json::from_str(&line).context("the server sent a reply that is not JSON")?;
        if let Some(error) = reply.get("error") {
            anyhow::bail!("{}", error.as_str().unwrap_or_default());
        }
        Ok(reply)
    }
}

pub fn run(socket: &Path, args: LockArgs) -> anyhow::Result<ExitCode> {
    let offset = ByteSize::parse(&args.offset).map_err(anyhow::Error::msg)?.0;
    let len = ByteSize::parse(&args.len).map_err(anyhow::Error::msg)?.0;
    let mut session = Session::open(socket)?;
    let locked = session
        .ask(&serde_json::json!({ "lock": {
            "export": args.export, "offset": offset, "len": len, "shared": args.shared
        } }))
        .context("lock refused")?;
    let id = locked["locked"]["id"]
        .as_u64()
        .context("no lock id in the reply")?;
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let status = std::process::Command::new(program)
        .args(rest)
        .status()
        .with_context(|| format!("cannot run {program}"));
    let unlocked = session.ask(&serde_json::json!({ "unlock": { "id": id } }));
    let status = status?;
    if let Err(error) = unlocked {
        errln!("strata lock: unlock: {error:#}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(match status.code() {
        Some(code) => ExitCode::from(code.clamp(0, 255) as u8),
        // Killed by a signal: the shell's convention, 128 + the signal.
        None => {
            use std::os::unix::process::ExitStatusExt;
            ExitCode::from((128 + status.signal().unwrap_or(0)).clamp(0, 255) as u8)
        }
    })
}
