//! TLS for NBD's STARTTLS, on both ends, with rustls (ring provider; x509 certificates).
//!
//! Server: an NBD server offers TLS (`On`) or insists on it (`Require`, qemu-nbd's and
//! nbdkit's `--tls=require`: a client that will not upgrade sees no export). With a CA given,
//! every client must present a certificate that CA signed; an export's allow-list then names
//! the client identities that may open it. An identity is a DNS name (or IP address) in the
//! client certificate's subject alternative names, the field webpki checks server names
//! against, so that `certtool`'s `dns_name` is all an administrator sets.
//!
//! Client: the built-in client upgrades before any other option, verifies the server's
//! certificate against a CA and a name (the URI's host unless told otherwise), and may
//! present its own certificate.
//!
//! Pre-shared keys (qemu's `tls-creds-psk`) are not offered: rustls has no external-PSK
//! support (rustls/rustls#174).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Whether a server offers TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// STARTTLS is refused (ERR_POLICY); everything is plaintext.
    Off,
    /// STARTTLS upgrades; plaintext clients are served too, except on exports with an
    /// allow-list.
    On,
    /// Every option but STARTTLS and ABORT is refused with ERR_TLS_REQD until the upgrade.
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;
    fn from_str(text: &str) -> Result<TlsMode, String> {
        match text {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            other => Err(format!(
                "TLS mode {other:?} is not one of \"off\", \"on\", \"require\""
            )),
        }
    }
}

impl fmt::Display for TlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        })
    }
}

/// Why TLS could not be set up from the files given.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("{path}: {why}")]
    File { path: PathBuf, why: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_error(path: &Path, why: impl fmt::Display) -> TlsSetupError {
    TlsSetupError::File {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file, in order; an empty file is an error.
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certificates.is_empty() {
        return Err(file_error(path, "no PEM certificate in the file"));
    }
    Ok(certificates)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, e))
}

fn load_roots(path: &Path) -> Result<RootCertStore, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    for certificate in load_certificates(path)? {
        roots
            .add(certificate)
            .map_err(|e| file_error(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// The files a server's TLS is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// The server's certificate chain (PEM), leaf first.
    pub certificate: PathBuf,
    pub key: PathBuf,
    /// When given, clients must present a certificate this CA signed.
    pub client_ca: Option<PathBuf>,
}

/// A server's TLS: its mode and, unless off, what upgrades connections.
#[derive(Clone)]
pub struct ServerTls {
    pub mode: TlsMode,
    acceptor: Option<TlsAcceptor>,
    verifies_clients: bool,
}

impl ServerTls {
    pub fn off() -> ServerTls {
        ServerTls {
            mode: TlsMode::Off,
            acceptor: None,
            verifies_clients: false,
        }
    }

    /// Reads the certificate, key and optional client CA; every file error names its file.
    pub fn load(mode: TlsMode, files: &ServerTlsFiles) -> Result<ServerTls, TlsSetupError> {
        if mode == TlsMode::Off {
            return Ok(ServerTls::off());
        }
        let chain = load_certificates(&files.certificate)?;
        let key = load_key(&files.key)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsSetupError::Config(e.to_string()))?;
        let builder = match &files.client_ca {
            Some(ca) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(load_roots(ca)?.into(), provider())
                        .build()
                        .map_err(|e| file_error(ca, e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder.with_single_cert(chain, key).map_err(|e| {
            file_error(
                &files.key,
                format!("does not go with {}: {e}", files.certificate.display()),
            )
        })?;
        Ok(ServerTls {
            mode,
            acceptor: Some(TlsAcceptor::from(Arc::new(config))),
            verifies_clients: files.client_ca.is_some(),
        })
    }

    /// What upgrades a connection, unless TLS is off.
    pub(crate) fn acceptor(&self) -> Option<&TlsAcceptor> {
        self.acceptor.as_ref()
    }

    /// Whether clients must present a certificate (and so can have an identity).
    pub fn verifies_clients(&self) -> bool {
        self.verifies_clients
    }
}

/// Who a client is, as far as TLS could tell.
#[derive(Clone, Debug, Default)]
pub enum Peer {
    /// No TLS on this connection.
    #[default]
    Plaintext,
    /// TLS, with the certificate chain the client presented (verified against the client CA),
    /// empty when the server asks for none.
    Tls(Vec<CertificateDer<'static>>),
}

impl Peer {
    pub fn is_tls(&self) -> bool {
        matches!(self, Peer::Tls(_))
    }

    /// The first of `allowed` that the client's certificate was issued to, if any.
    pub fn allowed_as<'a>(&self, allowed: &'a [String]) -> Option<&'a str> {
        let Peer::Tls(chain) = self else {
            return None;
        };
        let leaf = chain.first()?;
        let parsed = rustls::server::ParsedCertificate::try_from(leaf).ok()?;
        allowed
            .iter()
            .find(|identity| {
                ServerName::try_from(identity.as_str())
                    .is_ok_and(|name| rustls::client::verify_server_name(&parsed, &name).is_ok())
            })
            .map(String::as_str)
    }
}

/// Whether `identity` can stand in an allow-list: a DNS name or an IP address.
pub fn check_identity(identity: &str) -> Result<(), String> {
    ServerName::try_from(identity)
        .map(|_| ())
        .map_err(|_| format!("{identity:?} is not a DNS name or IP address"))
}

/// The files and name a client's TLS is made of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// The CA that signed the server's certificate.
    pub ca: PathBuf,
    /// Our certificate and key, for servers that ask for one.
    pub certificate: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// A client's TLS: what to trust, what to present, which name to expect.
#[derive(Clone)]
pub struct ClientTls {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// `server_name`: the name (or address) the server's certificate must be issued to.
    pub fn load(files: &ClientTlsFiles, server_name: &str) -> Result<ClientTls, TlsSetupError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsSetupError::Config(e.to_string()))?
            .with_root_certificates(load_roots(&files.ca)?);
        let config = match (&files.certificate, &files.key) {
            (Some(certificate), Some(key)) => builder
                .with_client_auth_cert(load_certificates(certificate)?, load_key(key)?)
                .map_err(|e| {
                    file_error(
                        key,
                        format!("does not go with {}: {e}", certificate.display()),
                    )
                })?,
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(TlsSetupError::Config(
                    "a client certificate needs its key, and a key its certificate".into(),
                ))
            }
        };
        let server_name = ServerName::try_from(server_name.to_string()).map_err(|_| {
            TlsSetupError::Config(format!(
                "{server_name:?} is not a DNS name or IP address to check the server's \
                 certificate against"
            ))
        })?;
        Ok(ClientTls {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }

    pub(crate) fn connector(&self) -> &TlsConnector {
        &self.connector
    }

    pub(crate) fn server_name(&self) -> ServerName<'static> {
        self.server_name.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for mode in [TlsMode::Off, TlsMode::On, TlsMode::Require] {
            assert_eq!(mode.to_string().parse::<TlsMode>(), Ok(mode));
        }
        assert!("yes".parse::<TlsMode>().unwrap_err().contains("\"yes\""));
    }

    #[test]
    fn identities_are_names_or_addresses() {
        assert!(check_identity("client1.example").is_ok());
        assert!(check_identity("192.0.2.7").is_ok());
        assert!(check_identity("CN=client1,O=x").is_err());
        assert!(check_identity("").is_err());
    }

    #[test]
    fn a_plaintext_peer_has_no_identity() {
        assert_eq!(Peer::Plaintext.allowed_as(&["a.example".into()]), None);
        assert_eq!(
            Peer::Tls(Vec::new()).allowed_as(&["a.example".into()]),
            None
        );
    }

    #[test]
    fn missing_files_are_named() {
        let files = ServerTlsFiles {
            certificate: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
            client_ca: None,
        };
        let error = ServerTls::load(TlsMode::Require, &files)
            .err()
            .expect("no such file");
        assert!(
            error.to_string().contains("/nonexistent/cert.pem"),
            "{error}"
        );
        assert!(ServerTls::load(TlsMode::Off, &files).is_ok());
    }
}
