//! STARTTLS on both ends: our client against our server with certificates made here (a CA, a
//! server certificate for localhost, client certificates per identity, and the bad ones: a
//! stranger CA's, an expired one). Each refusal is checked for its message on the client's
//! side; the option-level rules (ERR_TLS_REQD before the upgrade, ERR_POLICY with TLS off)
//! byte by byte.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, WriteFlags};
use strata_nbd::client::{ClientOptions, NbdUri, RemoteDevice};
use strata_nbd::proto::*;
use strata_nbd::tls::{ClientTls, ClientTlsFiles, ServerTls, ServerTlsFiles, TlsMode};
use strata_nbd::{Export, Exports, Limits, Listener, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::UnixListener;

const SIZE: u64 = 1 << 20;

/// A certificate authority made for one test.
struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn authority(name: &str) -> Authority {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Authority {
        issuer: Issuer::new(params, key),
        pem,
    }
}

/// A leaf certificate for `names`, signed by `by`: (certificate PEM, key PEM).
fn leaf(by: &Authority, names: &[&str], client: bool, expired: bool) -> (String, String) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names.clone()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, &names[0]);
    params.extended_key_usages = vec![if client {
        ExtendedKeyUsagePurpose::ClientAuth
    } else {
        ExtendedKeyUsagePurpose::ServerAuth
    }];
    if expired {
        params.not_before = date_time_ymd(2020, 1, 1);
        params.not_after = date_time_ymd(2020, 2, 1);
    }
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &by.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// The files of one test: the CA, the server's pair, client pairs by name.
struct Pki {
    dir: tempfile::TempDir,
    ca: Authority,
}

impl Pki {
    fn new() -> Pki {
        let pki = Pki {
            dir: tempfile::tempdir().unwrap(),
            ca: authority("strata test CA"),
        };
        std::fs::write(pki.path("ca.pem"), &pki.ca.pem).unwrap();
        let (cert, key) = leaf(&pki.ca, &["localhost"], false, false);
        std::fs::write(pki.path("server.pem"), cert).unwrap();
        std::fs::write(pki.path("server-key.pem"), key).unwrap();
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a client pair signed by `by` (the test CA when `None`); returns its files.
    fn client(
        &self,
        name: &str,
        identity: &str,
        by: Option<&Authority>,
        expired: bool,
    ) -> ClientTlsFiles {
        let (cert, key) = leaf(by.unwrap_or(&self.ca), &[identity], true, expired);
        std::fs::write(self.path(&format!("{name}.pem")), cert).unwrap();
        std::fs::write(self.path(&format!("{name}-key.pem")), key).unwrap();
        ClientTlsFiles {
            ca: self.path("ca.pem"),
            certificate: Some(self.path(&format!("{name}.pem"))),
            key: Some(self.path(&format!("{name}-key.pem"))),
        }
    }

    fn anonymous(&self) -> ClientTlsFiles {
        ClientTlsFiles {
            ca: self.path("ca.pem"),
            certificate: None,
            key: None,
        }
    }

    fn server(&self, mode: TlsMode, verify_clients: bool) -> ServerTls {
        let files = ServerTlsFiles {
            certificate: self.path("server.pem"),
            key: self.path("server-key.pem"),
            client_ca: verify_clients.then(|| self.path("ca.pem")),
        };
        ServerTls::load(mode, &files).unwrap()
    }
}

fn exports(allow: &[&str]) -> Arc<Exports> {
    let exports = Arc::new(Exports::new());
    exports.insert(Export {
        name: "vol".into(),
        description: String::new(),
        device: Arc::new(MemoryDevice::new(SIZE)),
        read_only: false,
        allow: allow.iter().map(|a| a.to_string()).collect(),
    });
    exports
}

/// Serves `exports` on a unix socket in `dir` until the test's runtime ends.
fn serve(dir: &Path, exports: Arc<Exports>, tls: ServerTls) -> PathBuf {
    let socket = dir.join("nbd.sock");
    let server = Server::with_tls(exports, Limits::default(), tls);
    let listener = UnixListener::bind(&socket).unwrap();
    tokio::spawn(server.run(Listener::Unix {
        listener,
        path: socket.clone(),
    }));
    socket
}

fn uri(scheme: &str, socket: &Path) -> NbdUri {
    format!("{scheme}:///vol?socket={}", socket.display())
        .parse()
        .unwrap()
}

fn options() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    }
}

async fn connect(
    socket: &Path,
    files: &ClientTlsFiles,
    name: &str,
) -> Result<RemoteDevice, strata_core::BlockError> {
    let tls = ClientTls::load(files, name).unwrap();
    RemoteDevice::connect_with(uri("nbds+unix", socket), options(), Some(tls)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_client_reads_and_writes_over_tls() {
    let pki = Pki::new();
    let socket = serve(
        pki.dir.path(),
        exports(&["client1.strata.test"]),
        pki.server(TlsMode::Require, true),
    );
    let files = pki.client("client1", "client1.strata.test", None, false);
    let device = connect(&socket, &files, "localhost").await.unwrap();
    let data: bytes::Bytes = (0..65536u32)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    device
        .write(4096, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    device.flush().await.unwrap();
    assert_eq!(device.read(4096, data.len()).await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_is_served_when_the_server_asks_for_none() {
    let pki = Pki::new();
    let socket = serve(pki.dir.path(), exports(&[]), pki.server(TlsMode::On, false));
    let device = connect(&socket, &pki.anonymous(), "localhost")
        .await
        .unwrap();
    assert_eq!(device.geometry().size, SIZE);
    // TLS on, not required: a plaintext client is served too.
    let plain = RemoteDevice::connect(uri("nbd+unix", &socket), options()).await;
    assert!(plain.is_ok(), "{:?}", plain.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_client_sees_no_export_when_tls_is_required() {
    let pki = Pki::new();
    let socket = serve(
        pki.dir.path(),
        exports(&[]),
        pki.server(TlsMode::Require, false),
    );
    let error = RemoteDevice::connect(uri("nbd+unix", &socket), options())
        .await
        .err()
        .expect("refused");
    assert!(error.to_string().contains("requires TLS"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_is_refused_by_a_server_without_tls() {
    let pki = Pki::new();
    let socket = serve(pki.dir.path(), exports(&[]), ServerTls::off());
    let error = connect(&socket, &pki.anonymous(), "localhost")
        .await
        .err()
        .expect("refused");
    assert!(
        error.to_string().contains("does not upgrade to TLS"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_client_certificates_are_refused() {
    let pki = Pki::new();
    let socket = serve(
        pki.dir.path(),
        exports(&["client1.strata.test"]),
        pki.server(TlsMode::Require, true),
    );
    let stranger = authority("someone else's CA");
    let cases = [
        ("no certificate", pki.anonymous(), "CertificateRequired"),
        (
            "another CA's",
            pki.client("forged", "client1.strata.test", Some(&stranger), false),
            "UnknownCA",
        ),
        (
            "expired",
            pki.client("expired", "client1.strata.test", None, true),
            "CertificateExpired",
        ),
        (
            "unlisted identity",
            pki.client("client2", "client2.strata.test", None, false),
            "allowed identities",
        ),
    ];
    for (case, files, expected) in cases {
        let error = connect(&socket, &files, "localhost")
            .await
            .err()
            .unwrap_or_else(|| panic!("{case}: the server let the client in"));
        let error = error.to_string();
        assert!(error.contains(expected), "{case}: {error}");
    }
    // The listed client still gets in: refusals disturbed nothing.
    let files = pki.client("client1", "client1.strata.test", None, false);
    connect(&socket, &files, "localhost").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_refuses_a_server_it_cannot_verify() {
    let pki = Pki::new();
    let socket = serve(
        pki.dir.path(),
        exports(&[]),
        pki.server(TlsMode::Require, false),
    );
    // A name the server's certificate was not issued to.
    let error = connect(&socket, &pki.anonymous(), "brick9.strata.test")
        .await
        .err()
        .expect("refused");
    assert!(error.to_string().contains("certificate"), "{error}");
    // A CA that did not sign the server's certificate.
    let stranger = authority("someone else's CA");
    std::fs::write(pki.path("stranger.pem"), &stranger.pem).unwrap();
    let files = ClientTlsFiles {
        ca: pki.path("stranger.pem"),
        certificate: None,
        key: None,
    };
    let error = connect(&socket, &files, "localhost")
        .await
        .err()
        .expect("refused");
    assert!(error.to_string().contains("UnknownIssuer"), "{error}");
}

#[tokio::test]
async fn an_nbds_uri_needs_tls_settings_and_nbd_takes_none() {
    let pki = Pki::new();
    let socket = pki.path("nowhere.sock");
    let error = RemoteDevice::connect(uri("nbds+unix", &socket), options())
        .await
        .err()
        .expect("refused");
    assert!(error.to_string().contains("needs TLS settings"), "{error}");
    let tls = ClientTls::load(&pki.anonymous(), "localhost").unwrap();
    let error = RemoteDevice::connect_with(uri("nbd+unix", &socket), options(), Some(tls))
        .await
        .err()
        .expect("refused");
    assert!(error.to_string().contains("plaintext URI"), "{error}");
}

// ---- the option-level rules, byte by byte ------------------------------------------------

fn raw_session(tls: ServerTls, allow: &[&str]) -> DuplexStream {
    let (client, server_end) = tokio::io::duplex(1 << 16);
    let server = Server::with_tls(exports(allow), Limits::default(), tls);
    tokio::spawn(server.serve_stream(server_end, "test".into()));
    client
}

async fn greet(client: &mut DuplexStream) {
    assert_eq!(client.read_u64().await.unwrap(), NBDMAGIC);
    assert_eq!(client.read_u64().await.unwrap(), IHAVEOPT);
    client.read_u16().await.unwrap();
    client
        .write_u32(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .await
        .unwrap();
}

async fn option(client: &mut DuplexStream, option: u32, data: &[u8]) -> (u32, String) {
    let mut out = BytesMut::new();
    put_option(&mut out, option, data.len() as u32);
    out.put_slice(data);
    client.write_all(&out).await.unwrap();
    assert_eq!(client.read_u64().await.unwrap(), OPTION_REPLY_MAGIC);
    assert_eq!(client.read_u32().await.unwrap(), option);
    let reply = client.read_u32().await.unwrap();
    let mut payload = vec![0; client.read_u32().await.unwrap() as usize];
    client.read_exact(&mut payload).await.unwrap();
    (reply, String::from_utf8_lossy(&payload).into_owned())
}

fn go_data(name: &str) -> Vec<u8> {
    let mut data = BytesMut::new();
    data.put_u32(name.len() as u32);
    data.put_slice(name.as_bytes());
    data.put_u16(0);
    data.to_vec()
}

#[tokio::test]
async fn before_the_upgrade_a_requiring_server_answers_tls_required() {
    let pki = Pki::new();
    let mut client = raw_session(pki.server(TlsMode::Require, false), &[]);
    greet(&mut client).await;
    for (opt, data) in [
        (OPT_LIST, Vec::new()),
        (OPT_GO, go_data("vol")),
        (OPT_INFO, go_data("vol")),
        (OPT_STRUCTURED_REPLY, Vec::new()),
    ] {
        let (reply, message) = option(&mut client, opt, &data).await;
        assert_eq!(reply, REP_ERR_TLS_REQD, "option {opt}: {message}");
        assert!(message.contains("STARTTLS"), "{message}");
    }
    // STARTTLS with data is malformed, and refused without ending the session.
    let (reply, _) = option(&mut client, OPT_STARTTLS, b"x").await;
    assert_eq!(reply, REP_ERR_INVALID);
    // EXPORT_NAME has no error reply: the server hangs up.
    let mut out = BytesMut::new();
    put_option(&mut out, OPT_EXPORT_NAME, 3);
    out.put_slice(b"vol");
    client.write_all(&out).await.unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    assert!(
        rest.is_empty(),
        "the server answered EXPORT_NAME without TLS"
    );
}

#[tokio::test]
async fn with_tls_off_starttls_is_refused_by_policy_and_the_session_goes_on() {
    let mut client = raw_session(ServerTls::off(), &[]);
    greet(&mut client).await;
    let (reply, message) = option(&mut client, OPT_STARTTLS, &[]).await;
    assert_eq!(reply, REP_ERR_POLICY);
    assert!(message.contains("not offered"), "{message}");
    let (reply, _) = option(&mut client, OPT_INFO, &go_data("vol")).await;
    assert_eq!(reply, REP_INFO);
}

#[tokio::test]
async fn an_export_with_an_allow_list_is_hidden_from_plaintext_clients() {
    let pki = Pki::new();
    let mut client = raw_session(pki.server(TlsMode::On, true), &["client1.strata.test"]);
    greet(&mut client).await;
    let (reply, message) = option(&mut client, OPT_GO, &go_data("vol")).await;
    assert_eq!(reply, REP_ERR_TLS_REQD, "{message}");
    // LIST answers with no entry before its ACK.
    let (reply, _) = option(&mut client, OPT_LIST, &[]).await;
    assert_eq!(reply, REP_ACK);
    // STARTTLS is accepted; the TLS handshake would follow.
    let (reply, _) = option(&mut client, OPT_STARTTLS, &[]).await;
    assert_eq!(reply, REP_ACK);
}
