//! The client side of the fixed-newstyle handshake: STRUCTURED_REPLY, then GO with the block
//! size constraints requested, falling back to EXPORT_NAME for a server that does not know GO.

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::ClientError;
use crate::proto::*;

/// What the server told us about the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    pub structured_replies: bool,
    /// Block size constraints (the spec's defaults when the server sent none).
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_block: u32,
}

impl ExportInfo {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

/// The largest option reply payload we accept: an INFO reply is at most a few bytes plus a
/// 4096-byte string; anything far larger is not a reply we asked for.
const MAX_OPTION_REPLY: u32 = 64 * 1024;

/// The payload limit the spec lets a client assume when the server states none (32 MiB).
const DEFAULT_MAX_BLOCK: u32 = 32 << 20;

/// Reads the server's greeting and sends our flags; returns whether the server leaves out
/// the zeroes after EXPORT_NAME's reply.
pub async fn greeting<S>(stream: &mut S) -> Result<bool, ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let magic = stream.read_u64().await?;
    if magic != NBDMAGIC {
        return Err(ClientError::Protocol(format!(
            "the server's greeting starts with {magic:#018x}, not NBDMAGIC"
        )));
    }
    let style = stream.read_u64().await?;
    if style == OLDSTYLE_MAGIC {
        return Err(ClientError::Protocol(
            "the server speaks the oldstyle handshake, which has no export names".into(),
        ));
    }
    if style != IHAVEOPT {
        return Err(ClientError::Protocol(format!(
            "the server's greeting has {style:#018x} where IHAVEOPT belongs"
        )));
    }
    let server_flags = stream.read_u16().await?;
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(ClientError::Protocol(
            "the server does not speak fixed newstyle".into(),
        ));
    }
    let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
    let mut client_flags = FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        client_flags |= FLAG_C_NO_ZEROES;
    }
    stream.write_u32(client_flags).await?;
    Ok(no_zeroes)
}

/// NBD_OPT_STARTTLS: the TLS handshake may start once this returns.
pub async fn start_tls<S>(stream: &mut S) -> Result<(), ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    send_option(stream, OPT_STARTTLS, &[]).await?;
    let (reply, payload) = read_option_reply(stream, OPT_STARTTLS).await?;
    match reply {
        REP_ACK if payload.is_empty() => Ok(()),
        reply if is_rep_err(reply) => Err(ClientError::Refused(format!(
            "the server does not upgrade to TLS: {}",
            refusal(reply, &payload)
        ))),
        other => Err(ClientError::Protocol(format!(
            "unexpected reply {other} to STARTTLS"
        ))),
    }
}

/// Options after the greeting (and the TLS upgrade, if any): structured replies, then the
/// export.
pub async fn negotiate<S>(
    stream: &mut S,
    export: &str,
    no_zeroes: bool,
) -> Result<ExportInfo, ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let structured_replies = structured_reply(stream).await?;
    if export.len() > MAX_STRING_LEN {
        return Err(ClientError::Protocol(format!(
            "export name of {} bytes is longer than the protocol's {MAX_STRING_LEN}",
            export.len()
        )));
    }
    let info = match go(stream, export).await? {
        Some(info) => info,
        None => export_name(stream, export, no_zeroes).await?,
    };
    Ok(ExportInfo {
        structured_replies,
        ..info
    })
}

async fn send_option<S: AsyncWrite + Unpin>(
    stream: &mut S,
    option: u32,
    data: &[u8],
) -> Result<(), ClientError> {
    let mut out = BytesMut::with_capacity(16 + data.len());
    put_option(&mut out, option, data.len() as u32);
    out.put_slice(data);
    stream.write_all(&out).await?;
    stream.flush().await?;
    Ok(())
}

/// One option reply: its type and payload.
async fn read_option_reply<S: AsyncRead + Unpin>(
    stream: &mut S,
    option: u32,
) -> Result<(u32, Vec<u8>), ClientError> {
    let magic = stream.read_u64().await?;
    if magic != OPTION_REPLY_MAGIC {
        return Err(ClientError::Protocol(format!(
            "option reply magic {magic:#018x} is wrong"
        )));
    }
    let answered = stream.read_u32().await?;
    if answered != option {
        return Err(ClientError::Protocol(format!(
            "the server answered option {answered} while we asked {option}"
        )));
    }
    let reply = stream.read_u32().await?;
    let length = stream.read_u32().await?;
    if length > MAX_OPTION_REPLY {
        return Err(ClientError::Protocol(format!(
            "option reply of {length} bytes exceeds {MAX_OPTION_REPLY}"
        )));
    }
    let mut payload = vec![0; length as usize];
    stream.read_exact(&mut payload).await?;
    Ok((reply, payload))
}

/// The message a server put in an error reply, for ours.
fn refusal(reply: u32, payload: &[u8]) -> String {
    let kind = match reply {
        REP_ERR_UNSUP => "unsupported",
        REP_ERR_POLICY => "refused by policy",
        REP_ERR_INVALID => "invalid",
        REP_ERR_UNKNOWN => "no such export",
        REP_ERR_TLS_REQD => "TLS required",
        REP_ERR_SHUTDOWN => "server shutting down",
        REP_ERR_TOO_BIG => "too big",
        _ => "error",
    };
    let text = String::from_utf8_lossy(payload);
    if text.is_empty() {
        format!("{kind} ({reply:#x})")
    } else {
        format!("{kind} ({reply:#x}): {text}")
    }
}

async fn structured_reply<S>(stream: &mut S) -> Result<bool, ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    send_option(stream, OPT_STRUCTURED_REPLY, &[]).await?;
    let (reply, payload) = read_option_reply(stream, OPT_STRUCTURED_REPLY).await?;
    match reply {
        REP_ACK => Ok(true),
        REP_ERR_TLS_REQD => Err(ClientError::Refused(format!(
            "the server requires TLS (use an nbds:// URI): {}",
            refusal(reply, &payload)
        ))),
        reply if is_rep_err(reply) => {
            tracing::debug!(
                "server declined structured replies: {}",
                refusal(reply, &payload)
            );
            Ok(false)
        }
        other => Err(ClientError::Protocol(format!(
            "unexpected reply {other} to STRUCTURED_REPLY"
        ))),
    }
}

/// NBD_OPT_GO; `None` when the server does not know it.
async fn go<S>(stream: &mut S, export: &str) -> Result<Option<ExportInfo>, ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut data = BytesMut::new();
    data.put_u32(export.len() as u32);
    data.put_slice(export.as_bytes());
    data.put_u16(1);
    data.put_u16(INFO_BLOCK_SIZE);
    send_option(stream, OPT_GO, &data).await?;
    let mut export_info = None;
    let mut sizes = None;
    loop {
        let (reply, payload) = read_option_reply(stream, OPT_GO).await?;
        match reply {
            REP_INFO => {
                let short = || {
                    ClientError::Protocol(format!("INFO reply of {} bytes is short", payload.len()))
                };
                let kind =
                    u16::from_be_bytes(payload.get(0..2).ok_or_else(short)?.try_into().unwrap());
                match kind {
                    INFO_EXPORT => {
                        let body = payload.get(2..12).ok_or_else(short)?;
                        let size = u64::from_be_bytes(body[0..8].try_into().unwrap());
                        let flags = u16::from_be_bytes(body[8..10].try_into().unwrap());
                        export_info = Some((size, flags));
                    }
                    INFO_BLOCK_SIZE => {
                        let body = payload.get(2..14).ok_or_else(short)?;
                        let word =
                            |i: usize| u32::from_be_bytes(body[i..i + 4].try_into().unwrap());
                        sizes = Some((word(0), word(4), word(8)));
                    }
                    // Names and descriptions are for people; others we did not ask for.
                    _ => {}
                }
            }
            REP_ACK => break,
            REP_ERR_UNSUP => return Ok(None),
            reply if is_rep_err(reply) => {
                return Err(ClientError::Refused(format!(
                    "export {export:?}: {}",
                    refusal(reply, &payload)
                )))
            }
            other => {
                return Err(ClientError::Protocol(format!(
                    "unexpected reply {other} to GO"
                )))
            }
        }
    }
    let (size, flags) = export_info.ok_or_else(|| {
        ClientError::Protocol("the server finished GO without NBD_INFO_EXPORT".into())
    })?;
    let (min_block, preferred_block, max_block) = sizes.unwrap_or((1, 4096, DEFAULT_MAX_BLOCK));
    let sane = min_block.is_power_of_two()
        && min_block <= 64 * 1024
        && preferred_block.is_power_of_two()
        && preferred_block >= min_block
        && max_block >= min_block;
    if !sane {
        return Err(ClientError::Protocol(format!(
            "block sizes min {min_block}, preferred {preferred_block}, max {max_block} break the \
             spec's rules"
        )));
    }
    Ok(Some(ExportInfo {
        size,
        flags,
        structured_replies: false,
        min_block,
        preferred_block,
        max_block,
    }))
}

/// NBD_OPT_EXPORT_NAME: no reply on failure (the server just closes), no block sizes.
async fn export_name<S>(
    stream: &mut S,
    export: &str,
    no_zeroes: bool,
) -> Result<ExportInfo, ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    send_option(stream, OPT_EXPORT_NAME, export.as_bytes()).await?;
    let size = stream.read_u64().await.map_err(|e| {
        ClientError::Refused(format!(
            "export {export:?}: the server closed the connection at EXPORT_NAME ({e})"
        ))
    })?;
    let flags = stream.read_u16().await?;
    if !no_zeroes {
        let mut zeroes = [0; 124];
        stream.read_exact(&mut zeroes).await?;
    }
    Ok(ExportInfo {
        size,
        flags,
        structured_replies: false,
        min_block: 1,
        preferred_block: 4096,
        max_block: DEFAULT_MAX_BLOCK,
    })
}
