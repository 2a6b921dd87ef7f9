//! NBD URIs as doc/uri.md in NetworkBlockDevice/nbd defines them: `nbd://host[:port]/export`
//! and `nbd+unix:///export?socket=/path`, and their TLS forms `nbds://` and `nbds+unix://`.
//! vsock is refused by name: we do not speak it.

use std::fmt;
use std::path::PathBuf;

/// The port an `nbd://` URI without one means (IANA's port for NBD).
pub const DEFAULT_PORT: u16 = 10809;

/// Where the server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// `host:port`, as `TcpStream::connect` takes it (IPv6 literals keep their brackets).
    Tcp(String),
    Unix(PathBuf),
}

/// A parsed NBD URI: where to connect and which export to ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    pub address: Address,
    pub export: String,
    /// `nbds` schemes: the connection upgrades to TLS before anything else.
    pub tls: bool,
    /// The URI as written, for messages.
    pub text: String,
}

impl NbdUri {
    /// The name the server's TLS certificate is checked against when none is configured:
    /// the URI's host (without brackets for IPv6), `localhost` for a unix socket.
    pub fn host(&self) -> String {
        match &self.address {
            Address::Tcp(host_port) => {
                let host = host_port
                    .rsplit_once(':')
                    .map_or(host_port.as_str(), |(h, _)| h);
                host.trim_start_matches('[').trim_end_matches(']').into()
            }
            Address::Unix(_) => "localhost".into(),
        }
    }
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for NbdUri {
    type Err = String;

    fn from_str(text: &str) -> Result<NbdUri, String> {
        let bad = |why: &str| format!("{text:?} is not an NBD URI: {why}");
        let (scheme, rest) = text.split_once("://").ok_or_else(|| {
            bad("expected nbd://host[:port]/export or nbd+unix:///export?socket=PATH")
        })?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path).ok_or_else(|| bad("bad %-escape in the export name"))?;
        let scheme = scheme.to_ascii_lowercase();
        let tls = matches!(scheme.as_str(), "nbds" | "nbds+unix");
        let address = match scheme.as_str() {
            "nbd" | "nbds" => {
                if authority.is_empty() {
                    return Err(bad(&format!("{scheme}:// needs a host")));
                }
                Address::Tcp(with_port(authority).map_err(|why| bad(&why))?)
            }
            "nbd+unix" | "nbds+unix" => {
                if !authority.is_empty() {
                    return Err(bad(&format!(
                        "{scheme}:// takes no host (write {scheme}:///export?socket=PATH)"
                    )));
                }
                let socket = query
                    .into_iter()
                    .flat_map(|q| q.split('&'))
                    .find_map(|pair| pair.strip_prefix("socket="))
                    .ok_or_else(|| bad(&format!("{scheme}:// needs ?socket=PATH")))?;
                let socket =
                    percent_decode(socket).ok_or_else(|| bad("bad %-escape in the socket path"))?;
                if socket.is_empty() {
                    return Err(bad("the socket path is empty"));
                }
                Address::Unix(PathBuf::from(socket))
            }
            "nbd+vsock" | "nbds+vsock" => {
                return Err(bad(&format!("scheme {scheme} (vsock) is not supported")))
            }
            _ => return Err(bad(&format!("unknown scheme {scheme:?}"))),
        };
        Ok(NbdUri {
            address,
            export,
            tls,
            text: text.to_string(),
        })
    }
}

/// `host` or `host:port` (IPv6 as `[addr]` or `[addr]:port`) as `host:port`.
fn with_port(authority: &str) -> Result<String, String> {
    let (host, port) = if let Some(after) = authority.strip_prefix('[') {
        let (host, tail) = after
            .split_once(']')
            .ok_or("an IPv6 host needs its closing ]")?;
        let port = match tail {
            "" => None,
            tail => Some(tail.strip_prefix(':').ok_or("junk after the IPv6 host")?),
        };
        (format!("[{host}]"), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (authority.to_string(), None),
        }
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(port) => port
            .parse::<u16>()
            .map_err(|_| format!("port {port:?} is not a number from 0 to 65535"))?,
    };
    Ok(format!("{host}:{port}"))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NbdUri, String> {
        text.parse()
    }

    #[test]
    fn tcp_uris_take_the_default_port_and_the_export_from_the_path() {
        let uri = parse("nbd://example.com/disk%201").unwrap();
        assert_eq!(uri.address, Address::Tcp("example.com:10809".into()));
        assert_eq!(uri.export, "disk 1");
        let uri = parse("nbd://127.0.0.1:2000").unwrap();
        assert_eq!(uri.address, Address::Tcp("127.0.0.1:2000".into()));
        assert_eq!(uri.export, "");
        let uri = parse("nbd://[::1]:7/e").unwrap();
        assert_eq!(uri.address, Address::Tcp("[::1]:7".into()));
        assert_eq!(
            parse("nbd://[::1]/e").unwrap().address,
            Address::Tcp("[::1]:10809".into())
        );
    }

    #[test]
    fn unix_uris_need_a_socket_and_no_host() {
        let uri = parse("nbd+unix:///vol?socket=/run/x%20y.sock").unwrap();
        assert_eq!(uri.address, Address::Unix("/run/x y.sock".into()));
        assert_eq!(uri.export, "vol");
        assert!(parse("nbd+unix:///vol")
            .unwrap_err()
            .contains("needs ?socket="));
        assert!(parse("nbd+unix://h/vol?socket=/s")
            .unwrap_err()
            .contains("takes no host"));
    }

    #[test]
    fn tls_schemes_mark_the_uri_and_name_the_host() {
        let uri = parse("nbds://brick1.example:2000/e").unwrap();
        assert!(uri.tls);
        assert_eq!(uri.host(), "brick1.example");
        let uri = parse("NBDS+UNIX:///e?socket=/s").unwrap();
        assert!(uri.tls);
        assert_eq!(uri.address, Address::Unix("/s".into()));
        assert_eq!(uri.host(), "localhost");
        assert_eq!(parse("nbds://[::1]/e").unwrap().host(), "::1");
        assert!(!parse("nbd://h/e").unwrap().tls);
        assert!(parse("nbds+unix:///e")
            .unwrap_err()
            .contains("nbds+unix:// needs ?socket="));
    }

    #[test]
    fn other_schemes_and_bad_ports_are_refused_by_name() {
        assert!(parse("nbd+vsock://2/e")
            .unwrap_err()
            .contains("not supported"));
        assert!(parse("http://h/e").unwrap_err().contains("unknown scheme"));
        assert!(parse("nbd://h:99999/e").unwrap_err().contains("port"));
        assert!(parse("disks/a.img").unwrap_err().contains("not an NBD URI"));
        assert!(parse("nbd://h/%zz").unwrap_err().contains("%-escape"));
    }
}
