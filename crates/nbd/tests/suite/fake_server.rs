//! A tiny NBD server that answers the handshake and then does whatever a test scripts: the
//! client's view of a misbehaving or silent server, written byte by byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::{BufMut, BytesMut};
use strata_nbd::proto::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// What the fake server does with each request: the bytes to answer with (none: silence).
pub type Script = fn(&Request) -> Option<Vec<u8>>;

pub const SIZE: u64 = 1 << 20;

/// Serves `script` on a unix socket in `dir` with the given transmission flags; every
/// connection gets the same treatment. Returns the socket's path.
pub fn start(dir: &Path, flags: u16, script: Script) -> PathBuf {
    start_with(dir, flags, false, script)
}

/// [`start`], accepting structured replies when `structured`.
pub fn start_with(dir: &Path, flags: u16, structured: bool, script: Script) -> PathBuf {
    let path = dir.join("fake.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let key = path.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            *accepted_table().entry(key.clone()).or_default() += 1;
            tokio::spawn(session(stream, flags, structured, script));
        }
    });
    path
}

fn accepted_table() -> std::sync::MutexGuard<'static, BTreeMap<PathBuf, usize>> {
    static ACCEPTED: Mutex<BTreeMap<PathBuf, usize>> = Mutex::new(BTreeMap::new());
    ACCEPTED.lock().unwrap()
}

/// Connections the fake server on `socket` has accepted so far.
pub fn accepted(socket: &Path) -> usize {
    accepted_table().get(socket).copied().unwrap_or(0)
}

async fn session(
    mut stream: UnixStream,
    flags: u16,
    structured: bool,
    script: Script,
) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    out.put_u64(NBDMAGIC);
    out.put_u64(IHAVEOPT);
    out.put_u16(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    stream.write_all(&out).await?;
    stream.read_u32().await?;
    loop {
        assert_eq!(stream.read_u64().await?, IHAVEOPT);
        let option = stream.read_u32().await?;
        let mut data = vec![0; stream.read_u32().await? as usize];
        stream.read_exact(&mut data).await?;
        let mut out = BytesMut::new();
        match option {
            OPT_STRUCTURED_REPLY if structured => put_option_reply(&mut out, option, REP_ACK, 0),
            OPT_STRUCTURED_REPLY => put_option_reply(&mut out, option, REP_ERR_UNSUP, 0),
            OPT_GO => {
                put_option_reply(&mut out, option, REP_INFO, 12);
                out.put_u16(INFO_EXPORT);
                out.put_u64(SIZE);
                out.put_u16(flags);
                put_option_reply(&mut out, option, REP_ACK, 0);
                stream.write_all(&out).await?;
                break;
            }
            _ => put_option_reply(&mut out, option, REP_ERR_UNSUP, 0),
        }
        stream.write_all(&out).await?;
    }
    loop {
        let mut header = [0; REQUEST_HEADER_LEN];
        stream.read_exact(&mut header).await?;
        let request = Request::parse(&header).expect("the client's request magic");
        if request.kind == CMD_WRITE {
            let mut payload = vec![0; request.length as usize];
            stream.read_exact(&mut payload).await?;
        }
        if let Some(answer) = script(&request) {
            stream.write_all(&answer).await?;
        }
    }
}

/// A simple reply header.
pub fn simple_reply(error: u32, handle: u64) -> Vec<u8> {
    let mut out = BytesMut::new();
    put_simple_reply(&mut out, error, handle);
    out.to_vec()
}

/// A structured reply chunk: header and payload.
pub fn chunk(flags: u16, kind: u16, handle: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    put_chunk_header(&mut out, flags, kind, handle, payload.len() as u32);
    out.put_slice(payload);
    out.to_vec()
}
