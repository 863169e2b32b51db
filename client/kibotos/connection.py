"""Connection options shared by the sync and asyncio clients: address, TLS, token, timeouts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import grpc

from .errors import KiboError, UnauthenticatedError
from .token_discovery import ENV_TOKEN, Discovery, discover

__all__ = [
    "DEFAULT_ADDRESS",
    "ENV_SERVER",
    "ENV_TOKEN",
    "Connection",
    "TokenStub",
    "check_address",
    "resolve_address",
]

DEFAULT_ADDRESS = "127.0.0.1:50051"
ENV_SERVER = "KIBO_SERVER"

_USER_AGENT = "kibotos/0.1"


def resolve_address(address: str | None = None) -> str:
    """The address given, else $KIBO_SERVER, else 127.0.0.1:50051."""
    return address or os.environ.get(ENV_SERVER) or DEFAULT_ADDRESS


# URL schemes people write before a server's address; grpc would take the whole string for a
# host name ("Misformatted domain name"). gRPC's own target schemes (dns:, unix:, ipv4:...) pass.
_URL_SCHEMES = ("http", "https", "grpc", "grpcs")


def check_address(address: str) -> str:
    """`address` if it is a gRPC target (HOST:PORT, or a gRPC target URI such as
    `dns:///HOST:PORT` or `unix:PATH`); a ValueError that says what to write instead for a URL."""
    scheme, separator, rest = address.partition("://")
    if separator and scheme.lower() in _URL_SCHEMES:
        tls = "; for TLS add --tls (kibotos: tls=True)" if scheme.lower() in ("https", "grpcs") else ""
        raise ValueError(
            f"{address!r} is a URL: drop the scheme, the server address is HOST:PORT of its gRPC port "
            f"(e.g. {rest.split('/')[0] or DEFAULT_ADDRESS}){tls}"
        )
    return address


@dataclass(frozen=True)
class Connection:
    """How to reach a kibo server.

    `token` is sent as `authorization: Bearer <token>` on every call, the typed methods' and
    the raw stubs'. `timeout` bounds each single call (settle and wait have their own overall
    deadlines). `discovery` says where the token came from (kibotos.token_discovery)."""

    address: str = field(default_factory=resolve_address)
    tls: bool = False
    root_certificates: bytes | None = None
    # A client certificate (PEM) and its key, for servers that require mutual TLS.
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    token: str | None = None
    timeout: float | None = 30.0
    # Reconnect soon after a server restart (gRPC's default backoff grows to 2 minutes).
    max_reconnect_backoff_ms: int = 2000
    channel_options: tuple[tuple[str, Any], ...] = ()
    discovery: Discovery | None = None

    def __post_init__(self) -> None:
        check_address(self.address)

    @classmethod
    def of(
        cls,
        address: str | None = None,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
        token: str | None = None,
        timeout: float | None = 30.0,
    ) -> Connection:
        """`token` defaults to the token discovery rule (kibotos.token_discovery: $KIBO_TOKEN,
        then a local server's admin token); any certificate implies TLS. A URL (`http://...`)
        is a ValueError that says to drop the scheme."""
        address = check_address(resolve_address(address))
        found = discover(address, token)
        return cls(
            address=address,
            tls=tls or root_certificates is not None or certificate_chain is not None,
            root_certificates=root_certificates,
            certificate_chain=certificate_chain,
            private_key=private_key,
            token=found.token,
            timeout=timeout,
            discovery=found,
        )

    def options(self) -> list[tuple[str, Any]]:
        return [
            ("grpc.primary_user_agent", _USER_AGENT),
            ("grpc.initial_reconnect_backoff_ms", min(200, self.max_reconnect_backoff_ms)),
            ("grpc.min_reconnect_backoff_ms", min(200, self.max_reconnect_backoff_ms)),
            ("grpc.max_reconnect_backoff_ms", self.max_reconnect_backoff_ms),
            *self.channel_options,
        ]

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not self.tls:
            return None
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )
        if self.token:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(self.token)
            )
        return credentials

    def open_channel(self) -> grpc.Channel:
        """A blocking channel to the server (kibotos.Client's)."""
        credentials = self.credentials()
        if credentials is not None:
            return grpc.secure_channel(self.address, credentials, self.options())
        return grpc.insecure_channel(self.address, self.options())

    def open_async_channel(self) -> grpc.aio.Channel:
        """An asyncio channel to the server (kibotos.AsyncClient's); open it inside the event loop."""
        credentials = self.credentials()
        if credentials is not None:
            return grpc.aio.secure_channel(self.address, credentials, self.options())
        return grpc.aio.insecure_channel(self.address, self.options())

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Per-call metadata; the token goes here only without TLS (with TLS the channel adds it)."""
        if self.token and not self.tls:
            return (("authorization", f"Bearer {self.token}"),)
        return ()

    def stub(self, stub: Any) -> Any:
        """A generated stub whose calls send the token (the channel does it with TLS)."""
        metadata = self.metadata()
        return TokenStub(stub, metadata) if metadata else stub

    def explain(self, error: KiboError) -> KiboError:
        """Say, on an UNAUTHENTICATED error about the bearer token, where the token came from or
        where it was looked for. A data-plane credential refused (field `credential`: revoked,
        or not valid) is not about the token: no token advice is added to it."""
        if isinstance(error, UnauthenticatedError) and error.field != "credential" and self.discovery is not None:
            error.token_discovery = self.discovery.describe()
            if self.discovery.token is not None:
                error.token_discovery += (
                    "; the server refused it: a server started with --data-dir DIR keeps its admin token in "
                    "DIR/admin.token (pass --token/KIBO_TOKEN, or restart it to refresh its pointer)"
                )
            else:
                error.token_discovery += (
                    "; a local kibo-ctrl serve writes DATA_DIR/admin.token on first start: pass it with "
                    "--token/KIBO_TOKEN"
                )
        return error


class _TokenCall:
    """One method of a stub, sending `metadata` unless the caller gives its own."""

    def __init__(self, method: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        self._method = method
        self._metadata = metadata

    def _with_token(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if kwargs.get("metadata") is None:
            kwargs["metadata"] = self._metadata
        return kwargs

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        return self._method(request, **self._with_token(kwargs))

    def with_call(self, request: Any, **kwargs: Any) -> Any:
        return self._method.with_call(request, **self._with_token(kwargs))

    def future(self, request: Any, **kwargs: Any) -> Any:
        return self._method.future(request, **self._with_token(kwargs))


class TokenStub:
    """A generated stub (sync or asyncio) whose every method sends the client's token: the raw
    stubs `client.workspaces`, ... authenticate like the typed methods."""

    def __init__(self, stub: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        self._stub = stub
        self._metadata = metadata

    def __getattr__(self, name: str) -> Any:
        return _TokenCall(getattr(self._stub, name), self._metadata)
