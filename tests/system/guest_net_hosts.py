"""Target hosts for the guest-network tests, all on this machine: each a network namespace of
the test's own with a 198.18.x.y address (the benchmark range, RFC 2544) behind a veth whose
host side is the route to it, and TCP listeners made INSIDE it by a thread that setns()s
there (a socket stays in the namespace it was made in): no process to start or wait for.

A listener greets each connection with b"hi\\n" and then echoes what it reads, so one
connection shows both a first contact and, later, whether it still carries data."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def socket_in(netns: str | None, address: str, port: int, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A listening TCP socket (or a bound UDP one: `kind`) on address:port, made in the named
    namespace (None: here)."""
    made: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            if netns is not None:
                fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if _libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns")
                finally:
                    os.close(fd)
            sock = socket.socket(socket.AF_INET, kind)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            if kind == socket.SOCK_STREAM:
                sock.listen(64)
            made.append(sock)
        except BaseException as error:
            made.append(error)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    result = made[0]
    if isinstance(result, BaseException):
        raise result
    return result


class Listener:
    """Greets and echoes, each connection in a thread; `close` ends all of it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.accepted = 0
        self._connections: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._connections.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(b"hi\n")
            while data := conn.recv(4096):
                conn.sendall(data)
        with contextlib.suppress(OSError):
            conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for conn in self._connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._thread.join(5)


@dataclass
class Host:
    """A target host: namespace `netns`, address `address`, its listeners."""

    netns: str
    veth: str
    address: str
    listeners: list[Listener] = field(default_factory=list)

    def listen(self, port: int = 0) -> int:
        listener = Listener(socket_in(self.netns, self.address, port))
        self.listeners.append(listener)
        return listener.port


@contextlib.contextmanager
def target_host(name: str, address: str, gateway: str, prefix: int = 24) -> Iterator[Host]:
    """A namespace `name` holding `address`/prefix, whose host side veth has `gateway` (the
    host's route to it). Names: at most 15 characters, never kibo's (kibo-*, kb*)."""
    veth = f"kt{name[-13:]}"
    ip("netns", "add", name)
    host = Host(name, veth, address)
    try:
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        ip("addr", "add", f"{gateway}/{prefix}", "dev", veth)
        ip("link", "set", veth, "up")
        ip("-n", name, "addr", "add", f"{address}/{prefix}", "dev", "eth0")
        ip("-n", name, "link", "set", "eth0", "up")
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "route", "add", "default", "via", gateway)
        yield host
    finally:
        for listener in host.listeners:
            listener.close()
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("link", "del", veth)
        with contextlib.suppress(subprocess.CalledProcessError):
            ip("netns", "del", name)


class Names:
    """A DNS server of the test's own on 127.0.0.1 (UDP): A records from `records`, which the
    test changes as it goes, with a 1 s TTL; any other name is NXDOMAIN. Counts the queries."""

    def __init__(self) -> None:
        self.records: dict[str, str] = {}
        self.queries: list[str] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import dns.message
        import dns.rcode
        import dns.rdatatype
        import dns.rrset

        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                query = dns.message.from_wire(data)
            except Exception:
                continue
            answer = dns.message.make_response(query)
            question = query.question[0]
            name = question.name.to_text(omit_final_dot=True).lower()
            self.queries.append(name)
            address = self.records.get(name)
            if address is None:
                answer.set_rcode(dns.rcode.NXDOMAIN)
            elif question.rdtype == dns.rdatatype.A:
                answer.answer.append(dns.rrset.from_text(question.name, 1, "IN", "A", address))
            with contextlib.suppress(OSError):
                self._sock.sendto(answer.to_wire(), peer)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def netns_names() -> list[str]:
    """The named network namespaces on the machine (`ip netns list`)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
