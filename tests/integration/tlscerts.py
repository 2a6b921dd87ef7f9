"""Certificates for the TLS tests, made with GnuTLS's certtool as an administrator would:
a CA, a server certificate for localhost, client certificates (one per identity), and the
bad ones the tests expect to be refused (another CA's, an expired one).

Each client gets a folder laid out as qemu's `tls-creds-x509` and libnbd's
`tls-certificates=` want it: ca-cert.pem, client-cert.pem, client-key.pem."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_NAME = "localhost"


def certtool(*args: str) -> None:
    subprocess.run(["certtool", *args], check=True, capture_output=True, timeout=60)


def _key(path: Path) -> Path:
    # RSA, certtool's default. GnuTLS writes EC keys with their curve parameters inside, which
    # ring (our TLS library's crypto) does not read; see docs/tls.md.
    certtool("--generate-privkey", "--bits=2048", "--outfile", str(path))
    return path


def _template(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Authority:
    cert: Path
    key: Path

    def sign(self, folder: Path, name: str, lines: list[str]) -> tuple[Path, Path]:
        key = _key(folder / f"{name}-key.pem")
        template = _template(folder / f"{name}.info", lines)
        cert = folder / f"{name}-cert.pem"
        certtool("--generate-certificate", "--load-privkey", str(key), "--load-ca-certificate",
                 str(self.cert), "--load-ca-privkey", str(self.key), "--template", str(template),
                 "--outfile", str(cert))
        return cert, key


def authority(folder: Path, name: str) -> Authority:
    folder.mkdir(parents=True, exist_ok=True)
    key = _key(folder / f"{name}-key.pem")
    template = _template(folder / f"{name}.info", [f'cn = "{name}"', "ca", "cert_signing_key",
                                                   "expiration_days = 30"])
    cert = folder / f"{name}-cert.pem"
    certtool("--generate-self-signed", "--load-privkey", str(key), "--template", str(template),
             "--outfile", str(cert))
    return Authority(cert, key)


def client_lines(identity: str, expired: bool = False) -> list[str]:
    lines = [f'cn = "{identity}"', f'dns_name = "{identity}"', "tls_www_client", "signing_key",
             "encryption_key"]
    if expired:
        lines += ['activation_date = "2020-01-01 00:00:00 UTC"',
                  'expiration_date = "2020-02-01 00:00:00 UTC"']
    else:
        lines.append("expiration_days = 30")
    return lines


@dataclass
class Pki:
    root: Path
    ca: Authority
    server_cert: Path
    server_key: Path

    def client(self, name: str, identity: str, *, signer: Authority | None = None,
               expired: bool = False) -> Path:
        """A client folder (ca-cert.pem = the real CA, so the client trusts our server)."""
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        cert, key = (signer or self.ca).sign(folder, "client", client_lines(identity, expired))
        shutil.copy(self.ca.cert, folder / "ca-cert.pem")
        assert cert == folder / "client-cert.pem" and key == folder / "client-key.pem"
        return folder

    def server_tls(self, mode: str = "require", verify_clients: bool = True) -> dict:
        return {"mode": mode, "certificate": str(self.server_cert), "key": str(self.server_key),
                "client-ca": str(self.ca.cert) if verify_clients else None}


def make_pki(root: Path) -> Pki:
    ca = authority(root / "ca", "ca")
    server_dir = root / "server"
    server_dir.mkdir(parents=True, exist_ok=True)
    cert, key = ca.sign(server_dir, "server", [
        f'cn = "{SERVER_NAME}"', f'dns_name = "{SERVER_NAME}"', 'ip_address = "127.0.0.1"',
        "tls_www_server", "signing_key", "encryption_key", "expiration_days = 30"])
    return Pki(root, ca, cert, key)
