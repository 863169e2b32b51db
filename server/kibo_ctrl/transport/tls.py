"""TLS for both listeners, with optional client-certificate authentication."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class Tls:
    cert: Path
    key: Path
    # With a CA, clients must present a certificate it signed (mutual TLS).
    client_ca: Path | None = None

    def check(self) -> None:
        for path in (self.cert, self.key, self.client_ca):
            if path is not None and not path.is_file():
                raise OSError(f"TLS file {path} does not exist")
        # Fails early, with the file named, on a key that does not match the certificate.
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.cert, self.key)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        ca = self.client_ca.read_bytes() if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )
