"""Connection options shared by the sync and asyncio clients: address, TLS, token, timeouts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import grpc

__all__ = ["DEFAULT_ADDRESS", "ENV_SERVER", "ENV_TOKEN", "Connection", "resolve_address"]

DEFAULT_ADDRESS = "127.0.0.1:50051"
ENV_SERVER = "KIBO_SERVER"
ENV_TOKEN = "KIBO_TOKEN"

_USER_AGENT = "kibotos/0.1"


def resolve_address(address: str | None = None) -> str:
    """The address given, else $KIBO_SERVER, else 127.0.0.1:50051."""
    return address or os.environ.get(ENV_SERVER) or DEFAULT_ADDRESS


@dataclass(frozen=True)
class Connection:
    """How to reach a kibo server.

    `token` is sent as `authorization: Bearer <token>` (on every call of the typed methods;
    with TLS also on calls made through the raw stubs). `timeout` bounds each single call
    (settle and wait have their own overall deadlines)."""

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
        """`token` defaults to $KIBO_TOKEN; any certificate implies TLS."""
        return cls(
            address=resolve_address(address),
            tls=tls or root_certificates is not None or certificate_chain is not None,
            root_certificates=root_certificates,
            certificate_chain=certificate_chain,
            private_key=private_key,
            token=token if token is not None else os.environ.get(ENV_TOKEN) or None,
            timeout=timeout,
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

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Per-call metadata; the token goes here only without TLS (with TLS the channel adds it)."""
        if self.token and not self.tls:
            return (("authorization", f"Bearer {self.token}"),)
        return ()
