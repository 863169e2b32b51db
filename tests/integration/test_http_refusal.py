"""A request refused for its token, sent with a small chunked body (as Node's HTTP/1.1 clients
send every request): the server reads the body to its end before it answers and closes, so
the client reads the error instead of a reset (EPIPE) while it is still writing. Found as the
flaky tests/system/test_examples.py::test_the_node_example_sends_the_token."""

from __future__ import annotations

import socket
from collections.abc import Callable

from tests.server import ServerProcess

HEAD = (
    "POST /kibo.ctrl.v1.WorkspaceService/GetCapabilities HTTP/1.1\r\n"
    "Host: kibo\r\n"
    "Authorization: Bearer not-a-token\r\n"
    "Content-Type: application/json\r\n"
    "Connect-Protocol-Version: 1\r\n"
    "Transfer-Encoding: chunked\r\n\r\n"
    "2\r\n{}\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def test_a_refused_chunked_request_is_answered_after_its_body(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(auth=True)
    host, port = server.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(HEAD.encode())
        # The body is not finished: the server waits for it (on main it answered and closed here).
        sock.settimeout(0.5)
        try:
            early = sock.recv(65536)
        except TimeoutError:
            early = b""
        assert early == b"", f"answered before the body ended: {early[:200]!r}"
        sock.settimeout(10)
        sock.sendall(LAST_CHUNK)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b'"unauthenticated"' in reply, reply
