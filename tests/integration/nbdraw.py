"""A minimal hand-written NBD client (fixed newstyle) for protocol edge cases
that libnbd refuses to produce: unknown commands and options, garbage,
truncated writes, clients that never read replies."""

from __future__ import annotations

import socket
import struct

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
OPT_REPLY_MAGIC = 0x3E889045565A9
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698
STRUCTURED_REPLY_MAGIC = 0x668E33EF

FLAG_FIXED_NEWSTYLE = 1
FLAG_NO_ZEROES = 2

OPT_EXPORT_NAME = 1
OPT_ABORT = 2
OPT_LIST = 3
OPT_INFO = 6
OPT_GO = 7
OPT_STRUCTURED_REPLY = 8

REP_ACK = 1
REP_SERVER = 2
REP_INFO = 3
REP_ERR_UNSUP = 0x80000001
REP_ERR_UNKNOWN = 0x80000006

INFO_EXPORT = 0
INFO_BLOCK_SIZE = 3

CMD_READ = 0
CMD_WRITE = 1
CMD_DISC = 2
CMD_FLUSH = 3
CMD_TRIM = 4

EPERM = 1
EINVAL = 22


class Closed(Exception):
    pass


class RawClient:
    def __init__(self, path: str | None = None, tcp: tuple[str, int] | None = None, timeout: float = 10.0,
                 rcvbuf: int | None = None):
        if tcp:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            addr = tcp
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            addr = path
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(addr)
        self.no_zeroes = False
        self.size = None
        self.tflags = None

    # -- io ------------------------------------------------------------------
    def recvall(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Closed(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def wait_closed(self, timeout: float = 10.0) -> bool:
        """True if the server closes the connection within timeout (reading
        and discarding anything it still sends)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                b = self.sock.recv(65536)
                if not b:
                    return True
        except ConnectionResetError:
            return True
        except (socket.timeout, TimeoutError):
            return False
        except OSError:
            return True

    # -- handshake -----------------------------------------------------------
    def handshake(self, client_flags: int | None = None) -> int:
        magic, opt_magic, hflags = struct.unpack(">QQH", self.recvall(18))
        assert magic == NBDMAGIC, hex(magic)
        assert opt_magic == IHAVEOPT, f"not newstyle: {opt_magic:#x}"
        assert hflags & FLAG_FIXED_NEWSTYLE, "server does not offer fixed newstyle"
        if client_flags is None:
            client_flags = FLAG_FIXED_NEWSTYLE | (hflags & FLAG_NO_ZEROES)
        self.no_zeroes = bool(client_flags & FLAG_NO_ZEROES)
        self.send(struct.pack(">I", client_flags))
        return hflags

    def send_option(self, opt: int, data: bytes = b"") -> None:
        self.send(struct.pack(">QII", IHAVEOPT, opt, len(data)) + data)

    def read_option_reply(self) -> tuple[int, int, bytes]:
        magic, opt, rtype, length = struct.unpack(">QIII", self.recvall(20))
        assert magic == OPT_REPLY_MAGIC, f"bad option reply magic {magic:#x}"
        data = self.recvall(length) if length else b""
        return opt, rtype, data

    def list_exports(self) -> list[str]:
        self.send_option(OPT_LIST)
        names = []
        while True:
            opt, rtype, data = self.read_option_reply()
            assert opt == OPT_LIST
            if rtype == REP_ACK:
                return names
            assert rtype == REP_SERVER, f"unexpected LIST reply {rtype:#x}"
            (n,) = struct.unpack(">I", data[:4])
            names.append(data[4:4 + n].decode())

    def go(self, name: str = "", infos: tuple[int, ...] = (INFO_BLOCK_SIZE,)) -> dict:
        nb = name.encode()
        payload = struct.pack(">I", len(nb)) + nb + struct.pack(">H", len(infos))
        payload += b"".join(struct.pack(">H", i) for i in infos)
        self.send_option(OPT_GO, payload)
        info = {}
        while True:
            opt, rtype, data = self.read_option_reply()
            assert opt == OPT_GO, f"reply for option {opt} while waiting for GO"
            if rtype == REP_ACK:
                break
            if rtype & 0x80000000:
                raise RuntimeError(f"GO failed: reply {rtype:#x} {data!r}")
            assert rtype == REP_INFO, f"unexpected GO reply {rtype:#x}"
            (itype,) = struct.unpack(">H", data[:2])
            if itype == INFO_EXPORT:
                self.size, self.tflags = struct.unpack(">QH", data[2:12])
                info["size"], info["flags"] = self.size, self.tflags
            elif itype == INFO_BLOCK_SIZE:
                info["block_size"] = struct.unpack(">III", data[2:14])
        assert self.size is not None, "GO acknowledged without NBD_INFO_EXPORT"
        return info

    def export_name(self, name: str) -> tuple[int, int]:
        self.send_option(OPT_EXPORT_NAME, name.encode())
        self.size, self.tflags = struct.unpack(">QH", self.recvall(10))
        if not self.no_zeroes:
            self.recvall(124)
        return self.size, self.tflags

    # -- transmission --------------------------------------------------------
    @staticmethod
    def request_bytes(cmd: int, handle: int, offset: int, length: int, flags: int = 0) -> bytes:
        return struct.pack(">IHHQQI", REQUEST_MAGIC, flags, cmd, handle, offset, length)

    def request(self, cmd: int, handle: int, offset: int, length: int, flags: int = 0, payload: bytes = b"") -> None:
        self.send(self.request_bytes(cmd, handle, offset, length, flags) + payload)

    def read_simple_reply(self, read_len: int = 0) -> tuple[int, int, bytes]:
        magic, err, handle = struct.unpack(">IIQ", self.recvall(16))
        assert magic == SIMPLE_REPLY_MAGIC, f"expected a simple reply, got magic {magic:#x}"
        data = self.recvall(read_len) if (read_len and err == 0) else b""
        return err, handle, data
