//! Fixed-newstyle option haggling, up to the start of the transmission phase.
//!
//! Every option gets an answer; only protocol violations (bad magic, unknown client flags,
//! an option payload too large to be honest) end the session, and they are logged.

use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, warn};

use crate::export::{Export, Exports};
use crate::proto::*;
use crate::tls::{Peer, TlsMode};
use crate::Limits;

/// What the client and server agreed on.
pub struct Negotiated {
    pub export: Arc<Export>,
    pub structured_replies: bool,
    pub base_allocation: bool,
    pub transmission_flags: u16,
    /// The allow-list entry the client's certificate matched, on an export that has one.
    pub identity: Option<String>,
}

/// How one round of option haggling ended.
pub enum Outcome {
    /// Transmission starts.
    Go(Negotiated),
    /// The client asked for STARTTLS and was told yes: the TLS handshake comes next, then
    /// haggling starts over on the encrypted stream.
    StartTls,
}

/// Why a handshake ended without entering transmission.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("client closed the connection during the handshake")]
    Closed,
    #[error("client aborted the handshake")]
    Aborted,
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The client was refused for what it is, not for how it spoke (no TLS, wrong identity).
    #[error("refused: {0}")]
    Refused(String),
    #[error("I/O error during the handshake: {0}")]
    Io(#[from] std::io::Error),
}

/// The client's meta-context selection, tied to the export it was made for.
#[derive(Default)]
struct MetaSelection {
    export_name: Option<String>,
    base_allocation: bool,
}

/// The connection as far as TLS goes: what the server offers and who the client proved to be.
#[derive(Clone, Copy)]
pub struct TlsContext<'a> {
    pub mode: TlsMode,
    pub peer: &'a Peer,
}

impl TlsContext<'_> {
    /// Plaintext, with TLS off: what a server without TLS settings does.
    pub const OFF: TlsContext<'static> = TlsContext {
        mode: TlsMode::Off,
        peer: &Peer::Plaintext,
    };

    /// Whether every option but STARTTLS and ABORT must be refused for now.
    fn upgrade_required(&self) -> bool {
        self.mode == TlsMode::Require && !self.peer.is_tls()
    }
}

struct Haggle<'a, S> {
    io: &'a mut S,
    exports: &'a Exports,
    limits: &'a Limits,
    tls: TlsContext<'a>,
    structured_replies: bool,
    meta: MetaSelection,
    out: BytesMut,
    /// Whether the log already says this client was refused for want of TLS.
    told_tls_required: bool,
}

/// Sends the greeting and reads the client's flags; returns whether the client asked for
/// no zeroes after EXPORT_NAME's reply.
pub async fn greet<S>(io: &mut S) -> Result<bool, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut greeting = BytesMut::with_capacity(18);
    greeting.put_u64(NBDMAGIC);
    greeting.put_u64(IHAVEOPT);
    greeting.put_u16(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    io.write_all(&greeting).await?;
    io.flush().await?;

    let client_flags = read_u32(io).await?;
    let known = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
    if client_flags & !known != 0 {
        return Err(HandshakeError::Protocol(format!(
            "unknown client flags {client_flags:#x}"
        )));
    }
    Ok(client_flags & FLAG_C_NO_ZEROES != 0)
}

/// Answers options until the client picks an export or asks for TLS. `options_left` bounds
/// the options of the whole handshake, across a STARTTLS. Nothing negotiated before an
/// upgrade survives it (the spec: state from the plaintext phase is not to be trusted).
pub async fn haggle<S>(
    io: &mut S,
    no_zeroes: bool,
    exports: &Exports,
    limits: &Limits,
    tls: TlsContext<'_>,
    options_left: &mut u32,
) -> Result<Outcome, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut haggle = Haggle {
        io,
        exports,
        limits,
        tls,
        structured_replies: false,
        meta: MetaSelection::default(),
        out: BytesMut::with_capacity(512),
        told_tls_required: false,
    };
    while *options_left > 0 {
        *options_left -= 1;
        if let Some(outcome) = haggle.one_option(no_zeroes).await? {
            return Ok(outcome);
        }
    }
    Err(HandshakeError::Protocol(format!(
        "more than {} options without entering transmission",
        limits.max_options
    )))
}

/// The whole handshake on a connection that cannot upgrade (TLS off): greeting, options.
pub async fn negotiate<S>(
    io: &mut S,
    exports: &Exports,
    limits: &Limits,
) -> Result<Negotiated, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let no_zeroes = greet(io).await?;
    let mut options_left = limits.max_options;
    match haggle(
        io,
        no_zeroes,
        exports,
        limits,
        TlsContext::OFF,
        &mut options_left,
    )
    .await?
    {
        Outcome::Go(negotiated) => Ok(negotiated),
        Outcome::StartTls => unreachable!("STARTTLS is refused with TLS off"),
    }
}

async fn read_u32<R: AsyncRead + Unpin>(reader: &mut R) -> Result<u32, HandshakeError> {
    match reader.read_u32().await {
        Ok(value) => Ok(value),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(HandshakeError::Closed),
        Err(e) => Err(e.into()),
    }
}

/// Whether a client may open an export, and as whom.
enum Access {
    Open(Option<String>),
    Refused { reply: u32, why: String },
}

impl<S> Haggle<'_, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    /// Reads and answers one option; returns how haggling ends once it does.
    async fn one_option(&mut self, no_zeroes: bool) -> Result<Option<Outcome>, HandshakeError> {
        let magic = match self.io.read_u64().await {
            Ok(magic) => magic,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(HandshakeError::Closed)
            }
            Err(e) => return Err(e.into()),
        };
        if magic != IHAVEOPT {
            return Err(HandshakeError::Protocol(format!(
                "bad option magic {magic:#x}"
            )));
        }
        let option = read_u32(self.io).await?;
        let length = read_u32(self.io).await?;
        if length > MAX_OPTION_LEN {
            // We could skip the payload, but a client announcing megabytes of option data is
            // not one we want to keep reading from.
            self.reply(option, REP_ERR_TOO_BIG, &[]).await?;
            return Err(HandshakeError::Protocol(format!(
                "option {option} with {length} bytes of data"
            )));
        }
        let mut data = vec![0u8; length as usize];
        self.io.read_exact(&mut data).await?;
        debug!(option, length, "option");
        if self.tls.upgrade_required() && option != OPT_STARTTLS && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                // It has no error reply: the spec says to hang up.
                return Err(HandshakeError::Refused(
                    "the client chose an export without TLS, which this server requires".into(),
                ));
            }
            if !self.told_tls_required {
                self.told_tls_required = true;
                warn!("client refused: it asked for option {option} without TLS, which this server requires");
            }
            self.error(
                option,
                REP_ERR_TLS_REQD,
                "this server requires TLS: send STARTTLS first",
            )
            .await?;
            return Ok(None);
        }
        match option {
            OPT_EXPORT_NAME => self.export_name(&data, no_zeroes).await,
            OPT_ABORT => {
                // The client may already be gone; the ACK is a courtesy.
                let _ = self.reply(option, REP_ACK, &[]).await;
                Err(HandshakeError::Aborted)
            }
            OPT_LIST => self.list(&data).await.map(|()| None),
            OPT_STRUCTURED_REPLY => {
                if data.is_empty() {
                    self.structured_replies = true;
                    self.reply(option, REP_ACK, &[]).await?;
                } else {
                    self.error(option, REP_ERR_INVALID, "option takes no data")
                        .await?;
                }
                Ok(None)
            }
            OPT_INFO | OPT_GO => self.info_or_go(option, &data).await,
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(option, &data).await.map(|()| None)
            }
            OPT_STARTTLS => self.start_tls(&data).await,
            _ => {
                self.error(option, REP_ERR_UNSUP, "unknown option").await?;
                Ok(None)
            }
        }
    }

    async fn start_tls(&mut self, data: &[u8]) -> Result<Option<Outcome>, HandshakeError> {
        let refusal = if !data.is_empty() {
            Some((REP_ERR_INVALID, "STARTTLS takes no data"))
        } else if self.tls.peer.is_tls() {
            Some((REP_ERR_INVALID, "TLS is already on"))
        } else if self.tls.mode == TlsMode::Off {
            Some((REP_ERR_POLICY, "TLS is not offered by this server"))
        } else {
            None
        };
        match refusal {
            Some((reply, message)) => {
                self.error(OPT_STARTTLS, reply, message).await?;
                Ok(None)
            }
            None => {
                self.reply(OPT_STARTTLS, REP_ACK, &[]).await?;
                Ok(Some(Outcome::StartTls))
            }
        }
    }

    /// Whether this client may open `export`: exports with an allow-list need TLS and a
    /// client certificate issued to one of the listed identities.
    fn access(&self, export: &Export) -> Access {
        if export.allow.is_empty() {
            return Access::Open(None);
        }
        if !self.tls.peer.is_tls() {
            return Access::Refused {
                reply: REP_ERR_TLS_REQD,
                why: format!(
                    "export {:?} is open only to listed clients over TLS: send STARTTLS first",
                    export.name
                ),
            };
        }
        match self.tls.peer.allowed_as(&export.allow) {
            Some(identity) => Access::Open(Some(identity.to_string())),
            None => Access::Refused {
                reply: REP_ERR_POLICY,
                why: format!(
                    "the client's certificate is issued to none of export {:?}'s allowed \
                     identities",
                    export.name
                ),
            },
        }
    }

    async fn reply(&mut self, option: u32, reply: u32, data: &[u8]) -> std::io::Result<()> {
        self.out.clear();
        put_option_reply(&mut self.out, option, reply, data.len() as u32);
        self.out.put_slice(data);
        self.io.write_all(&self.out).await?;
        self.io.flush().await
    }

    async fn error(&mut self, option: u32, reply: u32, message: &str) -> std::io::Result<()> {
        debug!(option, reply, message, "option refused");
        self.reply(option, reply, message.as_bytes()).await
    }

    /// Looks an export up and checks the client may open it, answering `REP_ERR_UNKNOWN`
    /// when there is none and the refusal when it may not. Returns the export and the
    /// identity the client opened it as.
    async fn find_export(
        &mut self,
        option: u32,
        name: &str,
    ) -> std::io::Result<Option<(Arc<Export>, Option<String>)>> {
        let Some(export) = self.exports.lookup(name) else {
            let message = format!("no export named {name:?}");
            self.error(option, REP_ERR_UNKNOWN, &message).await?;
            return Ok(None);
        };
        match self.access(&export) {
            Access::Open(identity) => Ok(Some((export, identity))),
            Access::Refused { reply, why } => {
                warn!("client refused: {why}");
                self.error(option, reply, &why).await?;
                Ok(None)
            }
        }
    }

    async fn export_name(
        &mut self,
        data: &[u8],
        no_zeroes: bool,
    ) -> Result<Option<Outcome>, HandshakeError> {
        let name = String::from_utf8_lossy(data).into_owned();
        let Some(export) = self.exports.lookup(&name) else {
            // NBD_OPT_EXPORT_NAME cannot fail politely: the spec says to hang up.
            return Err(HandshakeError::Protocol(format!(
                "no export named {name:?}"
            )));
        };
        let identity = match self.access(&export) {
            Access::Open(identity) => identity,
            Access::Refused { why, .. } => return Err(HandshakeError::Refused(why)),
        };
        let negotiated = self.agree(export, identity);
        self.out.clear();
        self.out.put_u64(negotiated.export.device.geometry().size);
        self.out.put_u16(negotiated.transmission_flags);
        if !no_zeroes {
            self.out.put_bytes(0, 124);
        }
        self.io.write_all(&self.out).await?;
        self.io.flush().await?;
        Ok(Some(Outcome::Go(negotiated)))
    }

    fn agree(&self, export: Arc<Export>, identity: Option<String>) -> Negotiated {
        let base_allocation = self.meta.base_allocation
            && self.meta.export_name.as_deref() == Some(export.name.as_str());
        Negotiated {
            transmission_flags: transmission_flags(&export, self.structured_replies),
            export,
            structured_replies: self.structured_replies,
            base_allocation,
            identity,
        }
    }

    async fn list(&mut self, data: &[u8]) -> Result<(), HandshakeError> {
        if !data.is_empty() {
            self.error(OPT_LIST, REP_ERR_INVALID, "option takes no data")
                .await?;
            return Ok(());
        }
        // Only the exports this client could open: an allow-list is not advertised to others.
        for export in self.exports.list() {
            if matches!(self.access(&export), Access::Refused { .. }) {
                continue;
            }
            let mut entry = BytesMut::new();
            let name = truncate_utf8(&export.name, MAX_STRING_LEN);
            entry.put_u32(name.len() as u32);
            entry.put_slice(name.as_bytes());
            entry.put_slice(truncate_utf8(&export.description, MAX_STRING_LEN).as_bytes());
            self.reply(OPT_LIST, REP_SERVER, &entry).await?;
        }
        self.reply(OPT_LIST, REP_ACK, &[]).await?;
        Ok(())
    }

    async fn info_or_go(
        &mut self,
        option: u32,
        data: &[u8],
    ) -> Result<Option<Outcome>, HandshakeError> {
        let Some((name, requests)) = parse_info_request(data) else {
            self.error(option, REP_ERR_INVALID, "malformed INFO/GO request")
                .await?;
            return Ok(None);
        };
        let Some((export, identity)) = self.find_export(option, &name).await? else {
            return Ok(None);
        };
        let negotiated = self.agree(export, identity);
        self.send_infos(option, &negotiated, &requests).await?;
        self.reply(option, REP_ACK, &[]).await?;
        Ok((option == OPT_GO).then_some(Outcome::Go(negotiated)))
    }

    async fn send_infos(
        &mut self,
        option: u32,
        negotiated: &Negotiated,
        requests: &[u16],
    ) -> std::io::Result<()> {
        let export = &negotiated.export;
        let geometry = export.device.geometry();
        let mut info = BytesMut::new();
        info.put_u16(INFO_EXPORT);
        info.put_u64(geometry.size);
        info.put_u16(negotiated.transmission_flags);
        self.reply(option, REP_INFO, &info).await?;

        // Block sizes are always sent: clients that did not ask still learn our limits.
        info.clear();
        info.put_u16(INFO_BLOCK_SIZE);
        info.put_u32(geometry.min_io);
        info.put_u32(geometry.preferred_io.max(geometry.min_io));
        info.put_u32(
            self.limits
                .max_payload
                .min(geometry.max_io)
                .max(geometry.min_io),
        );
        self.reply(option, REP_INFO, &info).await?;

        if requests.contains(&INFO_NAME) {
            info.clear();
            info.put_u16(INFO_NAME);
            info.put_slice(truncate_utf8(&export.name, MAX_STRING_LEN).as_bytes());
            self.reply(option, REP_INFO, &info).await?;
        }
        if requests.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
            info.clear();
            info.put_u16(INFO_DESCRIPTION);
            info.put_slice(truncate_utf8(&export.description, MAX_STRING_LEN).as_bytes());
            self.reply(option, REP_INFO, &info).await?;
        }
        Ok(())
    }

    async fn meta_context(&mut self, option: u32, data: &[u8]) -> Result<(), HandshakeError> {
        if option == OPT_SET_META_CONTEXT && !self.structured_replies {
            self.error(option, REP_ERR_INVALID, "structured replies not negotiated")
                .await?;
            return Ok(());
        }
        let Some((name, queries)) = parse_meta_request(data) else {
            self.error(option, REP_ERR_INVALID, "malformed meta context request")
                .await?;
            return Ok(());
        };
        let Some((export, _)) = self.find_export(option, &name).await? else {
            return Ok(());
        };
        let list_all = option == OPT_LIST_META_CONTEXT && queries.is_empty();
        let wanted = list_all
            || queries
                .iter()
                .any(|q| q == BASE_ALLOCATION || (option == OPT_LIST_META_CONTEXT && q == "base:"));
        if option == OPT_SET_META_CONTEXT {
            self.meta = MetaSelection {
                export_name: Some(export.name.clone()),
                base_allocation: wanted,
            };
        }
        if wanted {
            let mut context = BytesMut::new();
            context.put_u32(BASE_ALLOCATION_ID);
            context.put_slice(BASE_ALLOCATION.as_bytes());
            self.reply(option, REP_META_CONTEXT, &context).await?;
        }
        self.reply(option, REP_ACK, &[]).await?;
        Ok(())
    }
}

/// The transmission flags an export gets, given what was negotiated.
pub fn transmission_flags(export: &Export, structured_replies: bool) -> u16 {
    let caps = export.device.capabilities();
    let read_only = export.read_only || caps.read_only;
    let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_CACHE;
    if read_only {
        flags |= FLAG_READ_ONLY;
    } else {
        flags |= FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        if caps.discard {
            flags |= FLAG_SEND_TRIM;
        }
    }
    if structured_replies {
        flags |= FLAG_SEND_DF;
    }
    if caps.consistent_across_openers {
        flags |= FLAG_CAN_MULTI_CONN;
    }
    if caps.rotational {
        flags |= FLAG_ROTATIONAL;
    }
    flags
}

/// Splits a length-prefixed string off the front of `data`.
fn take_string(data: &[u8], len_bytes: usize) -> Option<(String, &[u8])> {
    let (len, rest) = data.split_at_checked(len_bytes)?;
    let len = match len_bytes {
        2 => u16::from_be_bytes(len.try_into().ok()?) as usize,
        _ => u32::from_be_bytes(len.try_into().ok()?) as usize,
    };
    if len > MAX_STRING_LEN {
        return None;
    }
    let (text, rest) = rest.split_at_checked(len)?;
    Some((String::from_utf8(text.to_vec()).ok()?, rest))
}

/// Parses NBD_OPT_INFO / NBD_OPT_GO data: name, then a counted list of info types.
fn parse_info_request(data: &[u8]) -> Option<(String, Vec<u16>)> {
    let (name, rest) = take_string(data, 4)?;
    let (count, rest) = rest.split_at_checked(2)?;
    let count = u16::from_be_bytes(count.try_into().ok()?) as usize;
    if rest.len() != count * 2 {
        return None;
    }
    let requests = rest
        .chunks_exact(2)
        .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
        .collect();
    Some((name, requests))
}

/// Parses LIST/SET_META_CONTEXT data: export name, then a counted list of query strings.
fn parse_meta_request(data: &[u8]) -> Option<(String, Vec<String>)> {
    let (name, rest) = take_string(data, 4)?;
    let (count, mut rest) = rest.split_at_checked(4)?;
    let count = u32::from_be_bytes(count.try_into().ok()?);
    let mut queries = Vec::new();
    for _ in 0..count {
        let (query, tail) = take_string(rest, 4)?;
        queries.push(query);
        rest = tail;
    }
    rest.is_empty().then_some((name, queries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_request_parses_and_rejects_inconsistent_counts() {
        let mut data = BytesMut::new();
        data.put_u32(3);
        data.put_slice(b"vol");
        data.put_u16(2);
        data.put_u16(INFO_NAME);
        data.put_u16(INFO_BLOCK_SIZE);
        let (name, requests) = parse_info_request(&data).unwrap();
        assert_eq!(name, "vol");
        assert_eq!(requests, vec![INFO_NAME, INFO_BLOCK_SIZE]);
        assert!(parse_info_request(&data[..data.len() - 1]).is_none());
        let mut long_name = BytesMut::new();
        long_name.put_u32(u32::MAX);
        assert!(parse_info_request(&long_name).is_none());
    }

    #[test]
    fn meta_request_requires_exact_length() {
        let mut data = BytesMut::new();
        data.put_u32(0);
        data.put_u32(1);
        data.put_u32(BASE_ALLOCATION.len() as u32);
        data.put_slice(BASE_ALLOCATION.as_bytes());
        let (name, queries) = parse_meta_request(&data).unwrap();
        assert_eq!(name, "");
        assert_eq!(queries, vec![BASE_ALLOCATION.to_string()]);
        data.put_u8(0);
        assert!(parse_meta_request(&data).is_none());
    }
}
