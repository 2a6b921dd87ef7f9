"""TLS (docs/tls.md): `strata serve` with `[tls] mode = "require"`, a client CA and an export
allow-list, driven by clients Strata did not write (qemu-img and qemu-io with
`tls-creds-x509`, nbdinfo and nbdcopy with `nbds://` URIs), with certificates made by
certtool. Each bad client (plaintext, unlisted identity, expired certificate, another CA's
certificate, a client that does not trust the server) is refused with a message on both
ends, and the server keeps serving. Then the other direction: Strata's own client reaching
TLS bricks (another `strata serve`, qemu-nbd, nbdkit)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness import MiB, Disk, Export, ServerSpec, run
from test_remote import bricks  # noqa: F401  (fixture)
from tlscerts import Pki, authority, make_pki

GOOD = "client1.strata.test"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    pki = make_pki(root)
    pki.client("good", GOOD)
    pki.client("unlisted", "client2.strata.test")
    pki.client("expired", GOOD, expired=True)
    pki.client("forged", GOOD, signer=authority(root / "stranger", "stranger"))
    # A client that trusts someone else's CA, not ours: it must refuse our server.
    distrust = pki.client("distrust", GOOD)
    (distrust / "ca-cert.pem").write_bytes((root / "stranger" / "stranger-cert.pem").read_bytes())
    return pki


def logged(srv, text: str, timeout: float = 10.0) -> str:
    """The server's log once it holds `text` (a refusal is logged as the connection ends,
    which may be just after the client has given up)."""
    deadline = time.monotonic() + timeout
    while text not in (log := srv.stderr_text()):
        assert time.monotonic() < deadline, f"the server never logged {text!r}:\n{log[-3000:]}"
        time.sleep(0.05)
    return log


def tls_spec(pki: Pki, allow: list[str] | None = None) -> ServerSpec:
    return ServerSpec(tcp=True, tls=pki.server_tls("require"),
                      exports=[Export("vol", "d0", allow=allow if allow is not None else [GOOD])])


def qemu_opts(srv, creds: Path) -> list[str]:
    return ["--object", f"tls-creds-x509,id=tls0,dir={creds},endpoint=client", "--image-opts",
            f"driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={srv.tcp_port},"
            f"export=vol,tls-creds=tls0"]


def nbds(srv, creds: Path) -> str:
    return f"nbds://127.0.0.1:{srv.tcp_port}/vol?tls-certificates={creds}"


def test_qemu_and_libnbd_clients_work_over_tls(pki, server_factory, workdir):
    srv = server_factory(tls_spec(pki))
    good = pki.root / "good"
    run(["qemu-io", *qemu_opts(srv, good), "-c", "write -P 0x5c 1M 2M", "-c", "flush"])
    info = run(["qemu-img", "info", *qemu_opts(srv, good)]).stdout
    assert "virtual size: 256 MiB" in info, info
    assert str(256 * MiB) in run(["nbdinfo", "--size", nbds(srv, good)]).stdout
    # nbdcopy out of the export, over TLS: the bytes qemu-io wrote.
    out = workdir / "copy.img"
    run(["nbdcopy", nbds(srv, good), str(out)])
    data = out.read_bytes()
    assert data[MiB:3 * MiB] == b"\x5c" * (2 * MiB)
    assert data[:MiB] == bytes(MiB)
    # and into it: a file copied in comes back byte for byte.
    src = workdir / "src.img"
    src.write_bytes(bytes(range(256)) * (256 * MiB // 256))
    run(["nbdcopy", str(src), nbds(srv, good)])
    back = workdir / "back.img"
    run(["nbdcopy", nbds(srv, good), str(back)])
    assert back.read_bytes() == src.read_bytes()
    # The session was the listed identity's, over TLS 1.3 (the server logs what it agreed).
    logged(srv, f"identity={GOOD}")
    logged(srv, "version=TLSv1_3")


@pytest.mark.parametrize("client, client_says, server_says", [
    ("plaintext", "TLS", "TLS"),
    ("unlisted", "allowed identities", "allowed identities"),
    ("expired", "", "certificate expired"),
    # GnuTLS clients do not send a certificate the server's CA did not sign: none arrives.
    ("forged", "", "peer sent no certificates"),
    ("distrust", "certificate", "TLS handshake failed"),
])
def test_bad_clients_are_refused_with_a_reason_on_both_ends(pki, server_factory, client, client_says,
                                                          server_says):
    srv = server_factory(tls_spec(pki))
    creds = pki.root / client
    if client == "plaintext":
        r = run(["nbdinfo", f"nbd://127.0.0.1:{srv.tcp_port}/vol"], check=False)
        q = run(["qemu-img", "info", f"nbd://127.0.0.1:{srv.tcp_port}/vol"], check=False)
    else:
        r = run(["nbdinfo", nbds(srv, creds)], check=False)
        q = run(["qemu-img", "info", *qemu_opts(srv, creds)], check=False)
    for refused in (r, q):
        assert refused.returncode != 0, refused.stdout
        assert refused.stderr.strip(), f"{refused.args[0]} was refused without a word"
    said = r.stderr + q.stderr
    assert client_says.lower() in said.lower(), said
    print(f"--- {client}: the clients said ---\n{said}")
    logged(srv, server_says)
    # Refusals disturb nothing: the listed client still reads and writes.
    run(["qemu-io", *qemu_opts(srv, pki.root / "good"), "-c", "write -P 1 0 4k"])


def test_qemu_psk_credentials_are_refused_clearly(pki, server_factory, workdir):
    """PSK is not offered (rustls has no external PSK): a PSK client fails its handshake
    rather than reach data."""
    srv = server_factory(tls_spec(pki, allow=[]))
    keys = workdir / "psk"
    keys.mkdir()
    run(["psktool", "-u", "qemu", "-p", str(keys / "keys.psk")])
    q = run(["qemu-img", "info", "--object", f"tls-creds-psk,id=tls0,dir={keys},username=qemu,"
             "endpoint=client", "--image-opts",
             f"driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={srv.tcp_port},"
             "export=vol,tls-creds=tls0"], check=False)
    assert q.returncode != 0 and q.stderr.strip(), q.stdout
    logged(srv, "TLS handshake failed")


def front_spec(uri: str, size: int, creds: Path, name: str | None = None) -> ServerSpec:
    disk = Disk("b0", size, uri=uri, timeout="10s", tls_ca=str(creds / "ca-cert.pem"),
                tls_certificate=str(creds / "client-cert.pem"),
                tls_key=str(creds / "client-key.pem"), tls_name=name)
    return ServerSpec(disks=[disk], exports=[Export("vol", "b0")])


def test_a_strata_front_reaches_a_strata_brick_over_tls(pki, server_factory):
    brick = server_factory(tls_spec(pki))
    front = server_factory(front_spec(f"nbds://127.0.0.1:{brick.tcp_port}/vol", 256 * MiB,
                                      pki.root / "good"))
    run(["qemu-io", "-f", "raw", "-c", "write -P 0x77 8M 1M", "-c", "flush", front.uri()])
    with open(brick.disk_file("d0"), "rb") as f:
        f.seek(8 * MiB)
        assert f.read(MiB) == b"\x77" * MiB
    assert front.stop() == 0


def test_a_strata_front_refuses_a_brick_it_cannot_verify(pki, server_factory):
    brick = server_factory(tls_spec(pki))
    spec = front_spec(f"nbds://127.0.0.1:{brick.tcp_port}/vol", 256 * MiB, pki.root / "good",
                      name="brick9.strata.test")
    spec.disks.append(Disk("d1", 16 * MiB))
    spec.exports.append(Export("plain", "d1"))
    front = server_factory(spec)
    err = front.stderr_text()
    assert "disk b0" in err and "certificate" in err.lower(), err[-3000:]
    r = run(["qemu-io", "-f", "raw", "-c", "read 0 4k", front.uri("vol")], check=False)
    assert r.returncode != 0, "a brick that failed verification must not be served"


def server_creds(pki: Pki, folder: Path) -> Path:
    """A server-side folder as qemu-nbd and nbdkit read it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca-cert.pem").write_bytes(pki.ca.cert.read_bytes())
    (folder / "server-cert.pem").write_bytes(pki.server_cert.read_bytes())
    (folder / "server-key.pem").write_bytes(pki.server_key.read_bytes())
    return folder


@pytest.mark.parametrize("peer", ["qemu-nbd", "nbdkit"])
def test_a_strata_front_reaches_other_tls_bricks(pki, bricks, server_factory, workdir, peer):
    creds = server_creds(pki, workdir / "server-creds")
    sock = workdir / f"{peer}.sock"
    if peer == "qemu-nbd":
        image = workdir / "brick.img"
        run(["qemu-img", "create", "-q", "-f", "raw", str(image), str(64 * MiB)])
        argv = ["qemu-nbd", "-f", "raw", "-k", str(sock), "-x", "brick", "-t", "-e", "2",
                "--object", f"tls-creds-x509,id=tls0,dir={creds},endpoint=server,verify-peer=on",
                "--tls-creds", "tls0", str(image)]
        export = "brick"
    else:
        argv = ["nbdkit", "-f", "-U", str(sock), "--tls=require", f"--tls-certificates={creds}",
                "--tls-verify-peer", "memory", str(64 * MiB)]
        export = ""
    bricks(argv, sock, export)
    front = server_factory(front_spec(f"nbds+unix:///{export}?socket={sock}", 64 * MiB,
                                      pki.root / "good"))
    run(["qemu-io", "-f", "raw", "-c", "write -P 0x3c 0 1M", "-c", "flush", "-c", "read -P 0x3c 0 1M",
         front.uri()])
    # The brick holds it: read back with a TLS client that is not ours.
    out = workdir / "back.img"
    run(["nbdcopy", "--connections=1",
         f"nbds+unix:///{export}?socket={sock}&tls-certificates={pki.root / 'good'}", str(out)])
    assert out.read_bytes()[:MiB] == b"\x3c" * MiB
    assert front.stop() == 0
