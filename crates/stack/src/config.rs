//! The TOML configuration: disks, exports, listeners. Every error names the file, the line
//! and the field, because an administrator fixing a config at 3 a.m. deserves no less.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

pub use crate::graph::check_name;
use crate::graph::{self, LayerConfig};
use strata_core::ByteSize;

/// The configuration `strata serve` uses when given none: one sparse file-backed disk
/// exported as `default`, on a unix socket and on localhost.
pub const EMBEDDED_DEFAULT: &str = r#"# Strata configuration, written on first start. Edit and restart to change.
listen = ["unix:nbd.sock", "tcp:127.0.0.1:10809"]
admin = "admin.sock"

# One sparse file as the disk.
[[disk]]
name = "disk0"
path = "disks/disk0.img"
size = "16GiB"

# A thin pool on it: space is allocated on first write (512 KiB extents) and given back on
# discard, so the file grows only with what the volumes hold.
[[layer]]
name = "pool"
kind = "thin-pool"
children = ["disk0"]
volumes = [{ name = "default", size = "16GiB" }]

[[export]]
name = "default"
device = "pool/default"
description = "Strata default volume (thin)"
"#;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// Where disks and sockets live; relative to the config file's folder.
    pub data_dir: Option<PathBuf>,
    /// Where clients connect; [`DEFAULT_LISTEN`] when left out (an empty list is an error).
    #[serde(default = "default_listen")]
    pub listen: Vec<Spanned<String>>,
    #[serde(default = "default_admin")]
    pub admin: PathBuf,
    /// Address of an HTTP listener serving Prometheus metrics at /metrics.
    pub metrics: Option<Spanned<String>>,
    #[serde(default, rename = "disk")]
    pub disks: Vec<DiskConfig>,
    /// Parsed by `graph::parse_layer`: each kind takes its own options.
    #[serde(default, rename = "layer")]
    pub layers: Vec<Spanned<toml::Table>>,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportConfig>,
    /// TLS for NBD clients (STARTTLS); off when left out.
    pub tls: Option<Spanned<TlsConfig>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct DiskConfig {
    pub name: Spanned<String>,
    /// A file or block device. Exactly one of `path` and `uri` is given.
    pub path: Option<Spanned<PathBuf>>,
    /// A remote export (`nbd://host[:port]/export`, `nbd+unix:///export?socket=PATH`): a
    /// brick, reached with Strata's NBD client. Never created or formatted by us.
    pub uri: Option<Spanned<String>>,
    /// A shared volume of a Strata cluster (issue 19), by its name in the cluster's catalog:
    /// striped and mirrored over bricks on other hosts, each flush an interval committed on
    /// all of them. Needs `etcd`.
    pub shared: Option<Spanned<String>>,
    /// A shared volume's etcd endpoints (`http://host:port`).
    #[serde(default)]
    pub etcd: Vec<String>,
    /// A shared volume's cluster (`strata` when left out).
    pub cluster: Option<String>,
    /// The name this host joins a shared volume's cluster as (`<disk name>-<process id>`
    /// when left out); two live members cannot share a name.
    pub member: Option<String>,
    /// A shared volume host's etcd lease (`"10s"` when left out): how long after this host
    /// dies the bricks wait before resolving what it left in doubt.
    pub lease: Option<Spanned<String>>,
    /// A shared volume written without consistency intervals: each write sent to its bricks
    /// at once, durable when answered, and nothing keeping the replicas equal if this host
    /// fails between them. The baseline `bench/shared.py` measures intervals against; not
    /// for data anyone keeps.
    #[serde(default)]
    pub unsafe_without_intervals: bool,
    /// A remote disk's per-request timeout (`"30s"` when left out).
    pub timeout: Option<Spanned<String>>,
    /// A remote disk's connections, used in turn; more than one only if the server
    /// advertises multi-conn.
    pub connections: Option<Spanned<usize>>,
    /// An `nbds://` disk's trust: the CA that signed the server's certificate (PEM).
    pub tls_ca: Option<Spanned<PathBuf>>,
    /// An `nbds://` disk's own certificate and key, for servers that verify clients.
    pub tls_certificate: Option<Spanned<PathBuf>>,
    pub tls_key: Option<Spanned<PathBuf>>,
    /// The name the server's certificate must be issued to (the URI's host when left out).
    pub tls_name: Option<Spanned<String>>,
    /// Size to create the file with when it does not exist.
    pub size: Option<Spanned<ByteSize>>,
    /// Create the file even though this config has started before (a disk added to an
    /// existing config). Without it only a config's first start creates files: a missing
    /// file of a config that has run is a vanished disk, not a new one (see `disk_state`).
    #[serde(default)]
    pub create: bool,
    #[serde(default)]
    pub direct: bool,
    #[serde(default)]
    pub read_only: bool,
    /// Serve page-cache hits on the async threads (see `FileOptions::inline_cached_io`).
    #[serde(default = "yes")]
    pub inline_io: bool,
    /// The member is known to be absent (set by `--assemble` for a member it did not find):
    /// layers that tolerate a missing member run degraded without it.
    #[serde(default)]
    pub missing: bool,
}

fn yes() -> bool {
    true
}

/// A remote disk's request timeout when its `[[disk]]` gives none.
pub const DEFAULT_REMOTE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// More connections to one brick than this buy nothing but sockets.
pub const MAX_REMOTE_CONNECTIONS: usize = 16;

impl DiskConfig {
    /// The file behind the disk, as configured (relative to the data folder); `None` for a
    /// remote disk.
    pub fn file(&self) -> Option<&Path> {
        self.path.as_ref().map(|p| p.get_ref().as_path())
    }

    /// A remote disk's URI, parsed (validated at load).
    pub fn remote(&self) -> Option<strata_nbd::client::NbdUri> {
        self.uri.as_ref().and_then(|u| u.get_ref().parse().ok())
    }

    /// A remote disk's connections (validated at load; 1 when left out).
    pub fn remote_connections(&self) -> usize {
        self.connections.as_ref().map_or(1, |c| *c.get_ref())
    }

    /// A remote disk's request timeout (validated at load).
    pub fn remote_timeout(&self) -> std::time::Duration {
        self.timeout
            .as_ref()
            .and_then(|t| strata_core::duration::parse_duration(t.get_ref()).ok())
            .unwrap_or(DEFAULT_REMOTE_TIMEOUT)
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ExportConfig {
    pub name: Spanned<String>,
    pub device: Spanned<String>,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub description: String,
    /// Client identities (DNS names or addresses in their TLS certificates) that may open
    /// this export; left out, any client may. Needs `[tls]` with a `client-ca`.
    #[serde(default)]
    pub allow: Vec<Spanned<String>>,
}

/// `[tls]`: how the server offers STARTTLS. Paths are relative to the data folder.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TlsConfig {
    /// `"on"` (plaintext clients too) or `"require"` (no export without TLS); `"off"`.
    pub mode: Spanned<String>,
    /// The server's certificate chain (PEM), leaf first.
    pub certificate: Spanned<PathBuf>,
    pub key: Spanned<PathBuf>,
    /// Clients must present a certificate this CA signed.
    pub client_ca: Option<Spanned<PathBuf>>,
}

impl Loaded {
    /// The server's TLS settings, with paths resolved; `None` when TLS is off.
    pub fn server_tls(
        &self,
    ) -> Option<(strata_nbd::tls::TlsMode, strata_nbd::tls::ServerTlsFiles)> {
        let tls = self.config.tls.as_ref()?.get_ref();
        let mode = tls.mode.get_ref().parse().ok()?;
        let files = strata_nbd::tls::ServerTlsFiles {
            certificate: self.resolve(tls.certificate.get_ref()),
            key: self.resolve(tls.key.get_ref()),
            client_ca: tls.client_ca.as_ref().map(|ca| self.resolve(ca.get_ref())),
        };
        Some((mode, files))
    }

    /// A remote disk's TLS settings, with paths resolved; `None` for a plaintext URI.
    pub fn disk_tls(&self, disk: &DiskConfig) -> Option<(strata_nbd::tls::ClientTlsFiles, String)> {
        let uri = disk.remote().filter(|u| u.tls)?;
        let resolve = |p: &Option<Spanned<PathBuf>>| p.as_ref().map(|p| self.resolve(p.get_ref()));
        let files = strata_nbd::tls::ClientTlsFiles {
            ca: resolve(&disk.tls_ca)?,
            certificate: resolve(&disk.tls_certificate),
            key: resolve(&disk.tls_key),
        };
        let name = disk
            .tls_name
            .as_ref()
            .map_or_else(|| uri.host(), |n| n.get_ref().clone());
        Some((files, name))
    }
}

/// Where a config without `listen` serves: the embedded default's listeners.
pub const DEFAULT_LISTEN: &[&str] = &["unix:nbd.sock", "tcp:127.0.0.1:10809"];

/// `listen` left out: [`DEFAULT_LISTEN`] (spanning nothing: they are not in the text).
fn default_listen() -> Vec<Spanned<String>> {
    DEFAULT_LISTEN
        .iter()
        .map(|addr| Spanned::new(0..0, addr.to_string()))
        .collect()
}

fn default_admin() -> PathBuf {
    PathBuf::from("admin.sock")
}

/// Where clients reach the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp(String),
}

/// A `listen` entry, as the configuration and `strata serve --listen` write it: `unix:PATH`
/// (a relative path is in the data folder) or `tcp:HOST:PORT`.
impl std::str::FromStr for ListenAddr {
    type Err = String;

    fn from_str(entry: &str) -> Result<ListenAddr, String> {
        if let Some(path) = entry.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("\"unix:\" needs a socket path".into());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        if let Some(addr) = entry.strip_prefix("tcp:") {
            return match addr.parse::<std::net::SocketAddr>() {
                Ok(_) => Ok(ListenAddr::Tcp(addr.to_string())),
                Err(_) => Err(format!(
                    "{addr:?} is not an address such as 127.0.0.1:10809"
                )),
            };
        }
        Err(format!("{entry:?} must start with \"unix:\" or \"tcp:\""))
    }
}

/// A configuration error with its place in the file.
#[derive(Debug)]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => write!(
                f,
                "{}: line {line}, column {column}: {}",
                self.file, self.message
            ),
            _ => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A parsed, validated configuration and where it came from.
#[derive(Clone)]
pub struct Loaded {
    pub config: Config,
    pub data_dir: PathBuf,
    pub listen: Vec<ListenAddr>,
    /// The `[[layer]]` tables, parsed.
    pub layers: Vec<LayerConfig>,
    /// Indexes into `layers`, children before parents.
    pub build_order: Vec<usize>,
    /// The file this came from, which reconfiguration updates.
    pub source: Option<PathBuf>,
    /// The file name and text errors found after loading (at build) point into.
    pub file: String,
    pub text: std::sync::Arc<str>,
}

impl Loaded {
    /// "file: line L, column C" of a byte offset in the config text, for errors found after
    /// loading (a disk's size the file system refuses).
    pub fn at(&self, offset: usize) -> String {
        let (line, column) = line_column(&self.text, offset);
        format!("{}: line {line}, column {column}", self.file)
    }

    /// Resolves a path from the config against the data folder.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        self.data_dir.join(path)
    }
}

/// Parses and validates `text`, read from `file`. `base` is the folder relative data-dir
/// paths resolve against; `data_dir_override` replaces the config's data-dir.
pub fn load(
    text: &str,
    file: &str,
    base: &Path,
    data_dir_override: Option<&Path>,
) -> Result<Loaded, ConfigError> {
    let config: Config = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map(|span| line_column(text, span.start)).unzip();
        ConfigError {
            file: file.into(),
            line,
            column,
            message: e.message().trim().to_string(),
        }
    })?;
    let error = |offset: usize, message: String| {
        let (line, column) = line_column(text, offset);
        ConfigError {
            file: file.into(),
            line: Some(line),
            column: Some(column),
            message,
        }
    };
    let layers = config
        .layers
        .iter()
        .map(|table| graph::parse_layer(text, table))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|l| error(l.at, l.message))?;
    validate(&config, &error)?;
    let disks: Vec<(String, usize)> = config
        .disks
        .iter()
        .map(|d| (d.name.get_ref().clone(), d.name.span().start))
        .collect();
    let exports: Vec<(String, usize)> = config
        .exports
        .iter()
        .map(|e| (e.device.get_ref().clone(), e.device.span().start))
        .collect();
    let build_order =
        graph::validate(text, &disks, &layers, &exports).map_err(|l| error(l.at, l.message))?;
    let mut listen = Vec::new();
    for entry in &config.listen {
        let addr = entry.get_ref().parse::<ListenAddr>();
        listen.push(addr.map_err(|m| error(entry.span().start, format!("field `listen`: {m}")))?);
    }
    if let Some(metrics) = &config.metrics {
        if metrics.get_ref().parse::<std::net::SocketAddr>().is_err() {
            let message = format!(
                "field `metrics`: {:?} is not an address such as 127.0.0.1:9810",
                metrics.get_ref()
            );
            return Err(error(metrics.span().start, message));
        }
    }
    let data_dir = match data_dir_override {
        Some(dir) => dir.to_path_buf(),
        None => base.join(
            config
                .data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(".")),
        ),
    };
    distinct_disk_files(&config, &data_dir, &error)?;
    Ok(Loaded {
        config,
        data_dir,
        listen,
        layers,
        build_order,
        source: None,
        file: file.into(),
        text: text.into(),
    })
}

/// Largest size a file can have: file offsets are signed 64-bit (off_t).
const MAX_FILE_BYTES: u64 = i64::MAX as u64;

/// What identifies the file behind a disk path: its (device, inode) when it exists (so that
/// symlinks and hard links compare equal), else the path with its existing part
/// canonicalised and the rest normalised lexically.
#[derive(PartialEq, Eq)]
enum FileKey {
    Inode(u64, u64),
    Path(PathBuf),
}

fn file_key(path: &Path) -> FileKey {
    use std::os::unix::fs::MetadataExt;
    if let Ok(meta) = std::fs::metadata(path) {
        return FileKey::Inode(meta.dev(), meta.ino());
    }
    // The longest existing ancestor, canonicalised (it may be reached through a symlink or
    // `..`), then the missing rest with `.` and `..` applied by hand.
    let parts: Vec<std::path::Component> = path.components().collect();
    let mut existing = PathBuf::new();
    let mut missing_from = parts.len();
    for (i, part) in parts.iter().enumerate() {
        let next = existing.join(part);
        if i > 0 && !next.exists() {
            missing_from = i;
            break;
        }
        existing = next;
    }
    let mut key = std::fs::canonicalize(&existing).unwrap_or(existing);
    for part in &parts[missing_from..] {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                key.pop();
            }
            other => key.push(other),
        }
    }
    FileKey::Path(key)
}

/// One file may back only one disk: as two mirror legs it would "mirror" onto itself, and
/// every write to one leg would silently be a write to the other.
fn distinct_disk_files(
    config: &Config,
    data_dir: &Path,
    error: &dyn Fn(usize, String) -> ConfigError,
) -> Result<(), ConfigError> {
    let mut seen: Vec<(FileKey, &DiskConfig, &Spanned<PathBuf>)> = Vec::new();
    for disk in config.disks.iter().filter(|d| !d.missing) {
        // A remote disk has no file here; two disks on one export are the server's business.
        let Some(path) = &disk.path else { continue };
        let key = file_key(&data_dir.join(path.get_ref()));
        if let Some((_, first, first_path)) = seen.iter().find(|(k, _, _)| *k == key) {
            let message = format!(
                "field `path`: disk {} ({}) is the same file as disk {} ({}): one file cannot \
                 be two disks",
                disk.name.get_ref(),
                path.get_ref().display(),
                first.name.get_ref(),
                first_path.get_ref().display()
            );
            return Err(error(path.span().start, message));
        }
        seen.push((key, disk, path));
    }
    Ok(())
}

/// Exactly one of `path` and `uri`; a remote disk takes none of a file's options, and only
/// a remote disk takes `timeout`.
fn validate_source(
    disk: &DiskConfig,
    error: &dyn Fn(usize, String) -> ConfigError,
) -> Result<(), ConfigError> {
    let name = disk.name.get_ref();
    if let Some(shared) = &disk.shared {
        let conflict = if disk.path.is_some() {
            Some("path")
        } else if disk.uri.is_some() {
            Some("uri")
        } else if disk.size.is_some() {
            Some("size")
        } else {
            None
        };
        if let Some(field) = conflict {
            let message = format!(
                "field `{field}`: disk {name} is a shared volume (`shared`); it has no `{field}`"
            );
            return Err(error(shared.span().start, message));
        }
        if disk.etcd.is_empty() {
            let message = format!(
                "disk {name} is a shared volume: give `etcd`, the cluster's etcd endpoints"
            );
            return Err(error(shared.span().start, message));
        }
        if let Some(lease) = &disk.lease {
            if let Err(why) = strata_core::duration::parse_duration(lease.get_ref()) {
                return Err(error(lease.span().start, format!("field `lease`: {why}")));
            }
        }
        return Ok(());
    }
    if !disk.etcd.is_empty()
        || disk.cluster.is_some()
        || disk.member.is_some()
        || disk.lease.is_some()
        || disk.unsafe_without_intervals
    {
        let message = format!(
            "disk {name}: `etcd`, `cluster`, `member`, `lease` and `unsafe-without-intervals` \
             belong to a shared volume (`shared`)"
        );
        return Err(error(disk.name.span().start, message));
    }
    let Some(uri) = &disk.uri else {
        if disk.path.is_none() {
            let message = format!(
                "disk {name} has neither `path` (a file or block device) nor `uri` (a remote \
                 export such as nbd://host/export): give one"
            );
            return Err(error(disk.name.span().start, message));
        }
        let remote_only = [
            ("timeout", disk.timeout.as_ref().map(|t| t.span().start)),
            (
                "connections",
                disk.connections.as_ref().map(|c| c.span().start),
            ),
            ("tls-ca", disk.tls_ca.as_ref().map(|c| c.span().start)),
            (
                "tls-certificate",
                disk.tls_certificate.as_ref().map(|c| c.span().start),
            ),
            ("tls-key", disk.tls_key.as_ref().map(|c| c.span().start)),
            ("tls-name", disk.tls_name.as_ref().map(|c| c.span().start)),
        ];
        if let Some((field, at)) = remote_only.iter().find_map(|(f, at)| at.map(|at| (f, at))) {
            let message = format!(
                "field `{field}`: disk {name} is a file; only a remote disk (`uri`) has it"
            );
            return Err(error(at, message));
        }
        return Ok(());
    };
    if let Some(path) = &disk.path {
        let message = format!(
            "field `path`: disk {name} has both `path` and `uri`: a disk is a file or a remote \
             export, not both"
        );
        return Err(error(path.span().start, message));
    }
    let parsed = match uri.get_ref().parse::<strata_nbd::client::NbdUri>() {
        Ok(parsed) => parsed,
        Err(why) => return Err(error(uri.span().start, format!("field `uri`: {why}"))),
    };
    validate_disk_tls(disk, &parsed, error)?;
    let file_only = [
        ("size", disk.size.as_ref().map(|s| s.span().start)),
        ("create", disk.create.then_some(disk.name.span().start)),
        ("direct", disk.direct.then_some(disk.name.span().start)),
    ];
    if let Some((field, at)) = file_only.iter().find_map(|(f, at)| at.map(|at| (f, at))) {
        let message = format!(
            "field `{field}`: disk {name} is remote (`uri`): it is never created, and its size \
             and caching are the server's"
        );
        return Err(error(at, message));
    }
    if let Some(connections) = &disk.connections {
        let n = *connections.get_ref();
        if !(1..=MAX_REMOTE_CONNECTIONS).contains(&n) {
            let message = format!(
                "field `connections`: disk {name}: {n} connections; give 1 to {MAX_REMOTE_CONNECTIONS}"
            );
            return Err(error(connections.span().start, message));
        }
    }
    if let Some(timeout) = &disk.timeout {
        match strata_core::duration::parse_duration(timeout.get_ref()) {
            Ok(t) if !t.is_zero() => {}
            Ok(_) => {
                let message =
                    format!("field `timeout`: disk {name}: a timeout of 0 fails every request");
                return Err(error(timeout.span().start, message));
            }
            Err(why) => {
                return Err(error(
                    timeout.span().start,
                    format!("field `timeout`: {why}"),
                ))
            }
        }
    }
    Ok(())
}

/// An `nbds://` disk needs the CA to check the server against; a plaintext one takes no TLS
/// settings; a certificate comes with its key.
fn validate_disk_tls(
    disk: &DiskConfig,
    uri: &strata_nbd::client::NbdUri,
    error: &dyn Fn(usize, String) -> ConfigError,
) -> Result<(), ConfigError> {
    let name = disk.name.get_ref();
    let given = [
        ("tls-ca", disk.tls_ca.as_ref().map(|c| c.span().start)),
        (
            "tls-certificate",
            disk.tls_certificate.as_ref().map(|c| c.span().start),
        ),
        ("tls-key", disk.tls_key.as_ref().map(|c| c.span().start)),
        ("tls-name", disk.tls_name.as_ref().map(|c| c.span().start)),
    ];
    if !uri.tls {
        if let Some((field, at)) = given.iter().find_map(|(f, at)| at.map(|at| (f, at))) {
            let message = format!(
                "field `{field}`: disk {name}'s URI is plaintext; write nbds:// to use TLS"
            );
            return Err(error(at, message));
        }
        return Ok(());
    }
    if disk.tls_ca.is_none() {
        let message = format!(
            "disk {name}: an nbds:// URI needs `tls-ca`, the CA that signed the server's \
             certificate"
        );
        return Err(error(disk.name.span().start, message));
    }
    match (&disk.tls_certificate, &disk.tls_key) {
        (Some(_), None) | (None, Some(_)) => {
            let message =
                format!("disk {name}: `tls-certificate` and `tls-key` go together: give both");
            Err(error(disk.name.span().start, message))
        }
        _ => Ok(()),
    }
}

/// `[tls]`'s mode is known and its files named; allow-lists need verified clients.
fn validate_tls(
    config: &Config,
    error: &dyn Fn(usize, String) -> ConfigError,
) -> Result<(), ConfigError> {
    let verifies_clients = match &config.tls {
        Some(tls) => {
            let tls = tls.get_ref();
            let mode = tls
                .mode
                .get_ref()
                .parse::<strata_nbd::tls::TlsMode>()
                .map_err(|why| error(tls.mode.span().start, format!("field `mode`: {why}")))?;
            mode != strata_nbd::tls::TlsMode::Off && tls.client_ca.is_some()
        }
        None => false,
    };
    for export in &config.exports {
        for identity in &export.allow {
            strata_nbd::tls::check_identity(identity.get_ref())
                .map_err(|why| error(identity.span().start, format!("field `allow`: {why}")))?;
        }
        if let Some(first) = export.allow.first() {
            if !verifies_clients {
                let message = format!(
                    "field `allow`: export {} names allowed clients, but no client is verified: \
                     give [tls] a mode of \"on\" or \"require\" and a `client-ca`",
                    export.name.get_ref()
                );
                return Err(error(first.span().start, message));
            }
        }
    }
    Ok(())
}

fn validate(
    config: &Config,
    error: &dyn Fn(usize, String) -> ConfigError,
) -> Result<(), ConfigError> {
    let mut disks = HashSet::new();
    for disk in &config.disks {
        let name = disk.name.get_ref();
        check_name(name)
            .map_err(|m| error(disk.name.span().start, format!("field `name`: {m}")))?;
        if !disks.insert(name.as_str()) {
            let message = format!("field `name`: a disk named {name:?} is already defined");
            return Err(error(disk.name.span().start, message));
        }
        validate_source(disk, error)?;
        if let Some(size) = &disk.size {
            let bytes = size.get_ref().0;
            let problem = if bytes == 0 {
                Some("a disk of 0 bytes could hold nothing".to_string())
            } else if bytes > MAX_FILE_BYTES {
                Some(format!(
                    "{bytes} bytes is more than any file can hold (at most {MAX_FILE_BYTES})"
                ))
            } else {
                None
            };
            if let Some(problem) = problem {
                let message = format!("field `size`: disk {name}: {problem}");
                return Err(error(size.span().start, message));
            }
        }
    }
    let mut exports = HashSet::new();
    for export in &config.exports {
        let name = export.name.get_ref();
        check_name(name)
            .map_err(|m| error(export.name.span().start, format!("field `name`: {m}")))?;
        if !exports.insert(name.as_str()) {
            let message = format!("field `name`: an export named {name:?} is already defined");
            return Err(error(export.name.span().start, message));
        }
    }
    if config.exports.is_empty() {
        return Err(error(
            0,
            "no [[export]] is defined: nothing to serve".into(),
        ));
    }
    validate_tls(config, error)?;
    if config.listen.is_empty() {
        return Err(error(
            0,
            "field `listen` is empty: clients could not reach any export".into(),
        ));
    }
    Ok(())
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(text: &str) -> Result<Loaded, ConfigError> {
        load(text, "test.toml", Path::new("/base"), None)
    }

    #[test]
    fn a_shared_volume_disk_names_its_volume_and_etcd_and_nothing_of_a_file() {
        let with = |fields: &str| {
            format!(
                "listen = [\"unix:s\"]\n[[disk]]\nname = \"sv\"\n{fields}\n[[export]]\nname = \"e\"\ndevice = \"sv\"\n"
            )
        };
        let ok = load_str(&with(
            "shared = \"v\"\netcd = [\"http://e:2379\"]\nlease = \"3s\"\nmember = \"h1\"",
        ))
        .unwrap();
        let disk = &ok.config.disks[0];
        assert_eq!(disk.shared.as_ref().unwrap().get_ref(), "v");
        assert_eq!((disk.file(), disk.remote().is_none()), (None, true));
        let refused = |fields: &str| match load_str(&with(fields)) {
            Ok(_) => panic!("accepted: {fields}"),
            Err(e) => e.to_string(),
        };
        let no_etcd = refused("shared = \"v\"");
        assert!(no_etcd.contains("give `etcd`"), "{no_etcd}");
        let file_too = refused("shared = \"v\"\netcd = [\"http://e:2379\"]\npath = \"d.img\"");
        assert!(file_too.contains("it has no `path`"), "{file_too}");
        let bad_lease = refused("shared = \"v\"\netcd = [\"http://e:2379\"]\nlease = \"soon\"");
        assert!(bad_lease.contains("field `lease`"), "{bad_lease}");
        let stray = refused("path = \"d.img\"\netcd = [\"http://e:2379\"]");
        assert!(stray.contains("belong to a shared volume"), "{stray}");
        let stray = refused("path = \"d.img\"\nunsafe-without-intervals = true");
        assert!(stray.contains("belong to a shared volume"), "{stray}");
        let through = load_str(&with(
            "shared = \"v\"\netcd = [\"http://e:2379\"]\nunsafe-without-intervals = true",
        ))
        .unwrap();
        assert!(through.config.disks[0].unsafe_without_intervals);
        assert!(
            !ok.config.disks[0].unsafe_without_intervals,
            "off unless asked"
        );
    }

    #[test]
    fn a_disk_is_a_file_or_a_remote_export_never_both() {
        let with = |fields: &str| {
            format!(
                "listen = [\"unix:s\"]\n[[disk]]\nname = \"b0\"\n{fields}\n[[export]]\nname = \"e\"\ndevice = \"b0\"\n"
            )
        };
        let remote = load_str(&with("uri = \"nbd://brick1:2000/vol\"\ntimeout = \"5s\"")).unwrap();
        let disk = &remote.config.disks[0];
        assert_eq!(disk.file(), None);
        assert_eq!(disk.remote().unwrap().export, "vol");
        assert_eq!(disk.remote_timeout(), std::time::Duration::from_secs(5));
        assert_eq!(disk.remote_connections(), 1);
        let plain = load_str(&with("uri = \"nbd+unix:///vol?socket=/s\"")).unwrap();
        assert_eq!(
            plain.config.disks[0].remote_timeout(),
            DEFAULT_REMOTE_TIMEOUT
        );
        let refused = [
            ("", "has neither `path`"),
            (
                "path = \"a.img\"\nuri = \"nbd://h/e\"",
                "has both `path` and `uri`",
            ),
            (
                "uri = \"http://h/e\"",
                "field `uri`: \"http://h/e\" is not an NBD URI",
            ),
            (
                "uri = \"nbd://h/e\"\nsize = \"1GiB\"",
                "field `size`: disk b0 is remote",
            ),
            (
                "uri = \"nbd://h/e\"\ncreate = true",
                "field `create`: disk b0 is remote",
            ),
            (
                "uri = \"nbd://h/e\"\ntimeout = \"soon\"",
                "field `timeout`: \"soon\" is not a duration",
            ),
            ("uri = \"nbd://h/e\"\ntimeout = \"0\"", "a timeout of 0"),
            (
                "path = \"a.img\"\ntimeout = \"1s\"",
                "field `timeout`: disk b0 is a file",
            ),
            (
                "path = \"a.img\"\nconnections = 2",
                "field `connections`: disk b0 is a file",
            ),
            (
                "uri = \"nbd://h/e\"\nconnections = 0",
                "0 connections; give 1 to 16",
            ),
            (
                "uri = \"nbd://h/e\"\nconnections = 17",
                "17 connections; give 1 to 16",
            ),
        ];
        for (fields, expected) in refused {
            let err = load_str(&with(fields)).err().unwrap();
            assert!(err.to_string().contains(expected), "{fields}: {err}");
            assert!(err.line.is_some(), "{err}");
        }
    }

    #[test]
    fn tls_settings_are_checked_where_they_are_written() {
        let with = |disk: &str, export: &str, tls: &str| {
            format!(
                "listen = [\"unix:s\"]\n[[disk]]\nname = \"b0\"\n{disk}\n[[export]]\nname = \"e\"\ndevice = \"b0\"\n{export}\n{tls}"
            )
        };
        let server = "[tls]\nmode = \"require\"\ncertificate = \"s.pem\"\nkey = \"k.pem\"\nclient-ca = \"ca.pem\"";
        let loaded = load_str(&with(
            "uri = \"nbds://brick1:2000/vol\"\ntls-ca = \"ca.pem\"",
            "allow = [\"client1.example\", \"192.0.2.7\"]",
            server,
        ))
        .unwrap();
        let (mode, files) = loaded.server_tls().unwrap();
        assert_eq!(mode, strata_nbd::tls::TlsMode::Require);
        assert_eq!(files.client_ca, Some(PathBuf::from("/base/ca.pem")));
        let (client, name) = loaded.disk_tls(&loaded.config.disks[0]).unwrap();
        assert_eq!(client.ca, PathBuf::from("/base/ca.pem"));
        assert_eq!(name, "brick1");
        let refused = [
            ("uri = \"nbds://h/e\"", "", "", "needs `tls-ca`"),
            (
                "uri = \"nbd://h/e\"\ntls-ca = \"ca.pem\"",
                "",
                "",
                "field `tls-ca`: disk b0's URI is plaintext",
            ),
            (
                "path = \"a.img\"\ntls-name = \"x\"",
                "",
                "",
                "field `tls-name`: disk b0 is a file",
            ),
            (
                "uri = \"nbds://h/e\"\ntls-ca = \"ca.pem\"\ntls-key = \"k.pem\"",
                "",
                "",
                "go together",
            ),
            (
                "path = \"a.img\"",
                "allow = [\"client1.example\"]",
                "",
                "no client is verified",
            ),
            (
                "path = \"a.img\"",
                "allow = [\"client1.example\"]",
                "[tls]\nmode = \"on\"\ncertificate = \"s.pem\"\nkey = \"k.pem\"",
                "no client is verified",
            ),
            (
                "path = \"a.img\"",
                "allow = [\"CN=client1\"]",
                server,
                "field `allow`: \"CN=client1\" is not a DNS name",
            ),
            (
                "path = \"a.img\"",
                "",
                "[tls]\nmode = \"yes\"\ncertificate = \"s.pem\"\nkey = \"k.pem\"",
                "field `mode`: TLS mode \"yes\"",
            ),
        ];
        for (disk, export, tls, expected) in refused {
            let err = load_str(&with(disk, export, tls)).err().unwrap();
            assert!(
                err.to_string().contains(expected),
                "{disk} {export} {tls}: {err}"
            );
            assert!(err.line.is_some(), "{err}");
        }
    }

    #[test]
    fn embedded_default_is_valid() {
        let loaded = load_str(EMBEDDED_DEFAULT).unwrap();
        assert_eq!(loaded.config.disks.len(), 1);
        assert_eq!(loaded.layers[0].kind, "thin-pool");
        assert_eq!(loaded.layers[0].volumes[0].name, "default");
        assert_eq!(loaded.layers[0].volumes[0].size, 16 << 30);
        assert_eq!(
            loaded.config.disks[0].size.as_ref().map(|s| *s.get_ref()),
            Some(ByteSize(16 << 30))
        );
        assert_eq!(loaded.listen.len(), 2);
        assert_eq!(loaded.data_dir, PathBuf::from("/base"));
        assert_eq!(loaded.listen[1], ListenAddr::Tcp("127.0.0.1:10809".into()));
    }

    #[test]
    fn listen_entries_are_unix_paths_or_tcp_addresses() {
        let parse = |entry: &str| entry.parse::<ListenAddr>();
        assert_eq!(
            parse("unix:/run/strata.sock"),
            Ok(ListenAddr::Unix("/run/strata.sock".into()))
        );
        assert_eq!(
            parse("unix:nbd.sock"),
            Ok(ListenAddr::Unix("nbd.sock".into()))
        );
        assert_eq!(
            parse("tcp:[::1]:10809"),
            Ok(ListenAddr::Tcp("[::1]:10809".into()))
        );
        for bad in [
            "unix:",
            "tcp:localhost",
            "tcp:127.0.0.1",
            "127.0.0.1:10809",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let err = load_str("listen = [\"tcp:nowhere\"]\n[[disk]]\nname = \"d0\"\npath = \"x\"\n[[export]]\nname = \"v\"\ndevice = \"d0\"\n")
            .err()
            .unwrap();
        assert!(
            err.message
                .starts_with("field `listen`: \"nowhere\" is not an address"),
            "{err}"
        );
    }

    #[test]
    fn a_config_without_listen_serves_where_the_embedded_default_does() {
        let text = "[[disk]]\nname = \"d0\"\npath = \"d0.img\"\n[[export]]\nname = \"e\"\ndevice = \"d0\"\n";
        let loaded = load_str(text).unwrap();
        let embedded = load_str(EMBEDDED_DEFAULT).unwrap();
        assert_eq!(loaded.listen, embedded.listen);
        assert_eq!(
            loaded.listen,
            [
                ListenAddr::Unix(PathBuf::from("nbd.sock")),
                ListenAddr::Tcp("127.0.0.1:10809".into())
            ]
        );
        // Listing no listener at all is still refused: that is a mistake, not a default.
        let err = load_str(&format!("listen = []\n{text}")).err().unwrap();
        assert!(err.to_string().contains("field `listen` is empty"), "{err}");
    }

    /// Two slices of one disk, the second starting at `second`.
    fn two_slices(second: &str) -> String {
        format!(
            "[[disk]]\nname = \"d0\"\npath = \"d0.img\"\n\
             [[layer]]\nname = \"low\"\nkind = \"slice\"\nchildren = [\"d0\"]\noffset = 0\nlength = \"1GiB\"\n\
             [[layer]]\nname = \"high\"\nkind = \"slice\"\nchildren = [\"d0\"]\noffset = \"{second}\"\n\
             [[export]]\nname = \"a\"\ndevice = \"low\"\n[[export]]\nname = \"b\"\ndevice = \"high\"\n"
        )
    }

    #[test]
    fn a_device_may_have_several_parents_using_disjoint_ranges() {
        let loaded = load_str(&two_slices("1GiB")).unwrap();
        assert_eq!(loaded.layers.len(), 2);
        assert!(loaded.layers.iter().all(|l| l.children == ["d0"]));
    }

    #[test]
    fn parents_using_overlapping_ranges_are_refused_with_the_ranges_named() {
        let err = load_str(&two_slices("512MiB")).err().unwrap().to_string();
        assert!(
            err.contains("line 13")
                && err.contains("\"d0\" is already a child of \"low\" (bytes 0B..1GiB)")
                && err.contains("\"high\" uses bytes 512MiB..the end")
                && err.contains("overlap"),
            "{err}"
        );
        // A layer that uses all of its child leaves no room for another parent.
        let text = two_slices("1GiB").replace(
            "name = \"high\"\nkind = \"slice\"",
            "name = \"high\"\nkind = \"concat\"",
        );
        let text = text.replace("offset = \"1GiB\"\n", "");
        let err = load_str(&text).err().unwrap().to_string();
        assert!(err.contains("\"high\" uses all of it"), "{err}");
    }

    #[test]
    fn one_file_may_back_only_one_disk() {
        let text = |second: &str| {
            format!("listen = [\"unix:s\"]\n[[disk]]\nname = \"a\"\npath = \"disks/a.img\"\n[[disk]]\nname = \"b\"\npath = \"{second}\"\n[[export]]\nname = \"e\"\ndevice = \"a\"\n")
        };
        for second in [
            "disks/a.img",
            "disks/../disks/a.img",
            "./disks/./a.img",
            "x/../disks/a.img",
        ] {
            let err = load_str(&text(second)).err().unwrap();
            assert_eq!(
                (err.line, err.column),
                (Some(7), Some(8)),
                "{second}: {err}"
            );
            assert!(
                err.to_string().contains("field `path`: disk b (")
                    && err.to_string().contains("disk a (disks/a.img)"),
                "{err}"
            );
        }
        assert!(load_str(&text("disks/b.img")).is_ok());
    }

    #[test]
    fn disk_sizes_must_fit_a_file() {
        let text = |size: &str| {
            format!("listen = [\"unix:s\"]\n[[disk]]\nname = \"d0\"\npath = \"d0.img\"\nsize = {size}\n[[export]]\nname = \"e\"\ndevice = \"d0\"\n")
        };
        for size in ["0", "\"0GiB\"", "\"8388608TiB\""] {
            let err = load_str(&text(size)).err().unwrap();
            assert_eq!((err.line, err.column), (Some(5), Some(8)), "{size}: {err}");
            assert!(err.to_string().contains("field `size`: disk d0: "), "{err}");
        }
        assert!(load_str(&text("\"8388607TiB\"")).is_ok());
    }

    #[test]
    fn unknown_device_names_line_and_field() {
        let text = "listen = [\"unix:s\"]\n[[disk]]\nname = \"d0\"\npath = \"d0.img\"\n\n[[export]]\nname = \"vol\"\ndevice = \"d9\"\n";
        let err = load_str(text).err().unwrap();
        assert_eq!(err.line, Some(8));
        assert!(err.to_string().contains("line 8"), "{err}");
        assert!(err.to_string().contains("`device`"), "{err}");
        assert!(err.to_string().contains("d9"), "{err}");
    }

    #[test]
    fn missing_field_and_unknown_key_are_located() {
        let missing = "listen = [\"unix:s\"]\n[[disk]]\nname = \"d0\"\n";
        let err = load_str(missing).err().unwrap();
        assert!(err.to_string().contains("path"), "{err}");
        assert!(err.line.is_some(), "{err}");
        let unknown =
            "listen = [\"unix:s\"]\n[[disk]]\nname = \"d0\"\npath = \"x\"\nsise = \"1GiB\"\n";
        let err = load_str(unknown).err().unwrap();
        assert_eq!(err.line, Some(5), "{err}");
        assert!(err.to_string().contains("sise"), "{err}");
    }

    #[test]
    fn thin_pool_layers_are_validated() {
        let base = "listen = [\"unix:s\"]\n[[disk]]\nname = \"d0\"\npath = \"x\"\n";
        let good = format!("{base}[[layer]]\nname = \"pool\"\nkind = \"thin-pool\"\nchildren = [\"d0\"]\nextent = \"64KiB\"\nvolumes = [{{ name = \"v\", size = \"1GiB\" }}]\n[[export]]\nname = \"e\"\ndevice = \"pool/v\"\n");
        let loaded = load_str(&good).unwrap();
        assert_eq!(loaded.layers[0].volumes[0].size, 1 << 30);
        let bad_kind = good.replace("thin-pool", "raid9");
        let err = load_str(&bad_kind).err().unwrap();
        assert_eq!(err.line, Some(7), "{err}");
        assert!(err.to_string().contains("raid9"), "{err}");
        let bad_child = good.replace("children = [\"d0\"]", "children = [\"d1\"]");
        let err = load_str(&bad_child).err().unwrap();
        assert!(err.to_string().contains("d1"), "{err}");
        let bad_extent = good.replace("64KiB", "96KiB");
        assert!(load_str(&bad_extent)
            .err()
            .unwrap()
            .to_string()
            .contains("extent"));
        let bad_export = good.replace("pool/v\"", "pool/w\"");
        assert!(load_str(&bad_export)
            .err()
            .unwrap()
            .to_string()
            .contains("pool/w"));
    }

    #[test]
    fn grow_from_needs_a_pool_on_a_concat_and_distinct_spares() {
        let base = "listen = [\"unix:s\"]\n[[disk]]\nname = \"d0\"\npath = \"x\"\n[[layer]]\nname = \"data\"\nkind = \"concat\"\nchildren = [\"d0\"]\n";
        let pool = |child: &str, spares: &str| {
            format!("{base}[[layer]]\nname = \"pool\"\nkind = \"thin-pool\"\nchildren = [\"{child}\"]\ngrow-from = {spares}\nvolumes = [{{ name = \"v\", size = \"1GiB\" }}]\n[[export]]\nname = \"e\"\ndevice = \"pool/v\"\n")
        };
        let loaded = load_str(&pool("data", "[\"s1.img\", \"s2.img\"]")).unwrap();
        assert_eq!(loaded.layers[1].grow_from, ["s1.img", "s2.img"]);
        let twice = load_str(&pool("data", "[\"s1.img\", \"s1.img\"]"))
            .err()
            .unwrap();
        assert!(twice.to_string().contains("listed twice"), "{twice}");
        assert_eq!(twice.line, Some(13), "{twice}");
        let not_list = load_str(&pool("data", "\"s1.img\"")).err().unwrap();
        assert!(
            not_list.to_string().contains("list of spare disk paths"),
            "{not_list}"
        );
        // A pool directly on a disk cannot take a spare in.
        let on_disk = pool("data", "[\"s1.img\"]")
            .replace(
                "[[layer]]\nname = \"data\"\nkind = \"concat\"\nchildren = [\"d0\"]\n",
                "",
            )
            .replace("children = [\"data\"]", "children = [\"d0\"]");
        let err = load_str(&on_disk).err().unwrap();
        assert!(err.to_string().contains("must be a concat layer"), "{err}");
        let on_stripe = format!("{base}[[layer]]\nname = \"s\"\nkind = \"stripe\"\nchildren = [\"data\"]\ngrow-from = [\"s1.img\"]\n[[export]]\nname = \"e\"\ndevice = \"s\"\n");
        let err = load_str(&on_stripe).err().unwrap();
        assert!(
            err.to_string()
                .contains("`grow-from`: a stripe has no such option"),
            "{err}"
        );
    }

    #[test]
    fn hierarchies_must_be_dags_whose_parents_do_not_overlap() {
        let disks = "listen = [\"unix:s\"]\n[[disk]]\nname = \"d0\"\npath = \"a\"\n[[disk]]\nname = \"d1\"\npath = \"b\"\n";
        let layer = |name: &str, kind: &str, children: &str| {
            format!("[[layer]]\nname = \"{name}\"\nkind = \"{kind}\"\nchildren = [{children}]\n")
        };
        let export = |device: &str| format!("[[export]]\nname = \"e\"\ndevice = \"{device}\"\n");
        // Children may be defined after their parent: the order is the graph's, not the file's.
        let ok = format!(
            "{disks}{}{}{}",
            layer("top", "slice", "\"mid\""),
            layer("mid", "slice", "\"d0\""),
            export("top")
        );
        let loaded = load_str(&ok).unwrap();
        let order: Vec<&str> = loaded
            .build_order
            .iter()
            .map(|&i| loaded.layers[i].name.as_str())
            .collect();
        assert_eq!(order, vec!["mid", "top"]);

        let cycle = format!(
            "{disks}{}{}{}",
            layer("a", "slice", "\"b\""),
            layer("b", "slice", "\"a\""),
            export("a")
        );
        let err = load_str(&cycle).err().unwrap();
        assert!(err.to_string().contains("cycle"), "{err}");
        assert!(err.line.is_some());

        let two_parents = format!(
            "{disks}{}{}{}",
            layer("a", "slice", "\"d0\""),
            layer("b", "slice", "\"d0\""),
            export("a")
        );
        let err = load_str(&two_parents).err().unwrap();
        assert!(
            err.to_string()
                .contains("\"d0\" is already a child of \"a\" (all of it)")
                && err.to_string().contains("the ranges overlap"),
            "{err}"
        );

        let internal = format!("{disks}{}{}", layer("a", "slice", "\"d0\""), export("d0"));
        let err = load_str(&internal).err().unwrap();
        assert!(err.to_string().contains("inside layer"), "{err}");

        let count = format!(
            "{disks}{}{}",
            layer("a", "slice", "\"d0\", \"d1\""),
            export("a")
        );
        let err = load_str(&count).err().unwrap();
        assert!(err.to_string().contains("exactly 1 child"), "{err}");

        let option = format!(
            "{disks}{}chunk = \"64KiB\"\n{}",
            layer("a", "slice", "\"d0\""),
            export("a")
        );
        let err = load_str(&option).err().unwrap();
        assert!(err.to_string().contains("`chunk`"), "{err}");
        assert_eq!(err.line, Some(12), "{err}");
    }

    /// A layer's options are checked against its kind's typed config when the file is
    /// loaded, and the error names the file, line, column and field.
    #[test]
    fn layer_options_are_type_checked_at_load_with_their_place() {
        let text = |option: &str| {
            format!(
                "listen = [\"unix:s\"]\n[[disk]]\nname = \"d0\"\npath = \"a\"\n\
                 [[disk]]\nname = \"d1\"\npath = \"b\"\n\
                 [[layer]]\nname = \"s\"\nkind = \"stripe\"\nchildren = [\"d0\", \"d1\"]\n\
                 {option}\n[[export]]\nname = \"e\"\ndevice = \"s\"\n"
            )
        };
        assert!(load_str(&text("chunk = \"64KiB\"")).is_ok());
        for (option, expect) in [
            // A size that is not one.
            ("chunk = \"lots\"", "field `chunk`: "),
            // A wrong type.
            ("chunk = true", "field `chunk`: "),
            // A field the kind does not have.
            ("chunks = \"64KiB\"", "field `chunks`: "),
        ] {
            let err = load_str(&text(option)).err().unwrap();
            assert_eq!(
                (err.file.as_str(), err.line, err.column),
                ("test.toml", Some(12), Some(1)),
                "{option}: {err}"
            );
            assert!(err.message.contains(expect), "{option}: {err}");
        }
        // A value the type accepts and the kind does not: located as well.
        let slice = text("").replace(
            "kind = \"stripe\"\nchildren = [\"d0\", \"d1\"]",
            "kind = \"slice\"\nchildren = [\"d0\"]\noffset = \"1.5KiBs\"",
        );
        let err = load_str(&slice).err().unwrap();
        assert_eq!((err.line, err.column), (Some(12), Some(1)), "{err}");
        assert!(err.message.contains("field `offset`: "), "{err}");
        // A required field left out points at the table.
        let crypt = text("").replace(
            "kind = \"stripe\"\nchildren = [\"d0\", \"d1\"]",
            "kind = \"crypt\"\nchildren = [\"d0\"]",
        );
        let err = load_str(&crypt).err().unwrap();
        assert_eq!(err.line, Some(8), "{err}");
        assert!(err.message.contains("`key-file` is required"), "{err}");
    }

    #[test]
    fn bad_values_are_refused() {
        let bad_size =
            "listen = [\"unix:s\"]\n[[disk]]\nname = \"d0\"\npath = \"x\"\nsize = \"big\"\n";
        let err = load_str(bad_size).err().unwrap();
        assert_eq!(err.line, Some(5), "{err}");
        let bad_listen = "listen = [\"udp:1\"]\n[[disk]]\nname = \"d0\"\npath = \"x\"\n[[export]]\nname = \"v\"\ndevice = \"d0\"\n";
        let err = load_str(bad_listen).err().unwrap();
        assert_eq!(err.line, Some(1), "{err}");
        let dup = "listen = [\"unix:s\"]\n[[disk]]\nname = \"d0\"\npath = \"x\"\n[[disk]]\nname = \"d0\"\npath = \"y\"\n";
        let err = load_str(dup).err().unwrap();
        assert_eq!(err.line, Some(6), "{err}");
    }
}
