"""Several exports, default export selection, LIST, TCP listener."""

from __future__ import annotations

import json

import nbd
import pytest

import nbdraw
from harness import MiB, Disk, Export, ServerSpec, close_handle, nbd_handle, pattern_bytes, requires_strata, run

pytestmark = requires_strata()


@pytest.mark.parametrize("exports", [
    [Export("vol", "big"), Export("default", "small")],  # the export named "default"
    [Export("first", "small"), Export("second", "big")],  # else the first one
], ids=["named-default", "first"])
def test_empty_name_selects_the_default_export_else_the_first(server_factory, exports):
    srv = server_factory(ServerSpec(disks=[Disk("big", 16 * MiB), Disk("small", 8 * MiB)], exports=exports))
    with nbd_handle(srv, export="") as h:
        assert h.get_size() == 8 * MiB
    for export in exports:
        with nbd_handle(srv, export=export.name) as h:
            assert h.get_size() == (16 if export.device == "big" else 8) * MiB
    # raw NBD_OPT_GO and NBD_OPT_EXPORT_NAME with the empty name
    c = nbdraw.RawClient(srv.sock)
    c.handshake()
    assert c.go("")["size"] == 8 * MiB
    c.close()
    c = nbdraw.RawClient(srv.sock)
    c.handshake()
    assert c.export_name("")[0] == 8 * MiB
    c.close()
    info = json.loads(run(["nbdinfo", "--json", f"nbd+unix:///?socket={srv.sock}"]).stdout)
    assert info["exports"][0]["export-size"] == 8 * MiB


def test_exports_are_isolated_and_aliases_share(server_factory):
    srv = server_factory(ServerSpec(
        disks=[Disk("a", 16 * MiB), Disk("b", 16 * MiB)],
        exports=[Export("va", "a"), Export("vb", "b"), Export("va2", "a"), Export("va-ro", "a", read_only=True)],
    ))
    da, db = pattern_bytes(1, MiB), pattern_bytes(2, MiB)
    with nbd_handle(srv, export="va") as a, nbd_handle(srv, export="vb") as b:
        a.pwrite(da, 0)
        b.pwrite(db, 0)
        a.flush()
        b.flush()
    with nbd_handle(srv, export="va2") as a2, nbd_handle(srv, export="vb") as b, \
            nbd_handle(srv, export="va-ro", strict=False) as ro:
        assert a2.pread(MiB, 0) == da
        assert b.pread(MiB, 0) == db
        assert ro.pread(MiB, 0) == da
        assert ro.is_read_only() and not a2.is_read_only()
        with pytest.raises(nbd.Error) as ei:
            ro.pwrite(b"x", 0)
        assert ei.value.errno == "EPERM"
    assert srv.disk_file("a").read_bytes()[:MiB] == da
    assert srv.disk_file("b").read_bytes()[:MiB] == db


def test_list_and_unknown_export(server_factory):
    names = ["vol", "default", "other-1", "x.y_z-" + "x" * 58]
    srv = server_factory(ServerSpec(
        disks=[Disk("d0", 8 * MiB)],
        exports=[Export(n, "d0") for n in names],
    ))
    c = nbdraw.RawClient(srv.sock)
    c.handshake()
    assert sorted(c.list_exports()) == sorted(names)
    c.send_option(nbdraw.OPT_ABORT)
    c.close()
    h = nbd.NBD()
    with pytest.raises(nbd.Error):
        h.connect_uri(f"nbd+unix:///nope?socket={srv.sock}")
    close_handle(h)
    # libnbd's own list mode
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.connect_uri(f"nbd+unix:///?socket={srv.sock}")
    got = []
    h.opt_list(lambda name, desc: got.append(name))
    assert sorted(got) == sorted(names)
    h.opt_abort()
    close_handle(h)
    with nbd_handle(srv, export=names[3]) as h:
        assert h.get_size() == 8 * MiB


def test_tcp_listener(server_factory):
    srv = server_factory(ServerSpec(disks=[Disk("d0", 32 * MiB)], exports=[Export("vol", "d0")], tcp=True))
    info = json.loads(run(["nbdinfo", "--json", srv.tcp_uri("vol")]).stdout)
    assert info["exports"][0]["export-size"] == 32 * MiB
    assert info["exports"][0]["export-name"] == "vol"
    data = pattern_bytes(4, 3 * MiB + 7)
    with nbd_handle(srv, tcp=True) as t:
        t.pwrite(data, 123)
        t.flush()
    with nbd_handle(srv) as u:
        assert u.pread(len(data), 123) == data
    c = nbdraw.RawClient(tcp=("127.0.0.1", srv.tcp_port))
    c.handshake()
    assert c.go("vol")["size"] == 32 * MiB
    c.request(nbdraw.CMD_READ, 1, 123, 4096)
    err, handle, got = c.read_simple_reply(4096)
    assert (err, got) == (0, data[:4096])
    c.request(nbdraw.CMD_DISC, 2, 0, 0)
    c.close()
