"""The node link's certificates (SECURITY.md: the node link), with the `cryptography` library:
the cluster CA, a node's key and certificate signing request, the certificate the CA issues
for a node, and the join token that carries the CA's pin.

Names: the CA's certificate is also the control plane's own on the node port and on the
guest hop (its subject "kibo cluster CA" contains spaces, so no node ID can ever be it; its
SAN is CONTROL_PLANE_NAME, the name nodes check). A node's certificate names the node: CN the
node ID, SAN DNS `node_name(node_id)`, the name the control plane checks when it dials the
node, so one node's certificate cannot stand for another's. Keys are EC P-256 (fast to make
and to sign; a CSR of another kind is refused before anything is signed)."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..domain.errors import InvalidArgument

CA_NAME = "kibo cluster CA"
# The control plane's name on the node port (the CA certificate's SAN): what a node checks.
CONTROL_PLANE_NAME = "kibo-control-plane"
NODE_DOMAIN = "node.kibo"
CA_LIFETIME = datetime.timedelta(days=3650)
NODE_LIFETIME = datetime.timedelta(days=30)
# Certificates start a little in the past: a node whose clock is behind still accepts them.
BACKDATE = datetime.timedelta(minutes=5)
# A CSR larger than this is refused unread (an EC P-256 CSR in PEM is ~500 bytes).
MAX_CSR_BYTES = 4096
# A join token: the node token, '.', and sha256 of the CA certificate's DER in hex. Node
# tokens are `kibo_` and URL-safe base64 (api/auth.py), which has no '.', so the split is
# unambiguous, and a token without the suffix is an old one (refused without
# --insecure-node-link).
PIN_SEPARATOR = "."
_PIN = re.compile(r"[0-9a-f]{64}")
PROOF = _PIN  # a join proof is an HMAC-SHA256 in lowercase hex too


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def pin_of(cert_pem: str) -> str:
    """sha256 of the certificate's DER, hex: what a join token pins."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def join_token(token: str, ca_cert_pem: str) -> str:
    return f"{token}{PIN_SEPARATOR}{pin_of(ca_cert_pem)}"


def split_join_token(text: str) -> tuple[str, str]:
    """(the node token, the CA pin); the pin is "" for an old-style token without one."""
    token, separator, pin = text.strip().rpartition(PIN_SEPARATOR)
    if not separator:
        return text.strip(), ""
    if not _PIN.fullmatch(pin) or not token:
        raise ValueError("a join token is TOKEN.SHA256 (64 lowercase hex digits after the last '.')")
    return token, pin


def join_proof(token_digest: str, node_id: str, csr_pem: str) -> str:
    """The join token's proof for one CSR (IssueNodeCertificateRequest.join_proof): HMAC-SHA256
    keyed with the token's digest (api/auth.py token_hash, as the store keeps it)."""
    message = f"{node_id}\n{csr_pem}".encode()
    return hmac.new(token_digest.encode(), message, hashlib.sha256).hexdigest()


def private_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def new_key() -> str:
    """A new EC P-256 private key, PKCS#8 PEM."""
    return private_pem(ec.generate_private_key(ec.SECP256R1()))


def make_ca() -> tuple[str, str]:
    """A new self-signed cluster CA: (certificate PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(CONTROL_PLANE_NAME)]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode(), private_pem(key)


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def node_name(node_id: str) -> str:
    """The DNS name in a node's certificate, which the control plane checks when it dials it."""
    return f"{node_id}.{NODE_DOMAIN}"


def make_csr(key_pem: str) -> str:
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kibo node")]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def csr_key(csr_pem: str) -> tuple[ec.EllipticCurvePublicKey, str]:
    """The CSR's public key, checked (size, kind, signature), and sha256 of its DER (hex)."""
    if len(csr_pem) > MAX_CSR_BYTES:
        raise InvalidArgument(f"csr_pem: at most {MAX_CSR_BYTES} bytes", field="csr_pem")
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode())
        key = csr.public_key()
        valid = csr.is_signature_valid
    except (ValueError, TypeError, InvalidSignature, x509.UnsupportedGeneralNameType):
        raise InvalidArgument("csr_pem: not a PEM certificate signing request", field="csr_pem") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise InvalidArgument("csr_pem: the key must be EC P-256", field="csr_pem")
    if not valid:
        raise InvalidArgument("csr_pem: its signature does not match its key", field="csr_pem")
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key, hashlib.sha256(der).hexdigest()


def sign_node(ca_cert_pem: str, ca_key_pem: str, key: ec.EllipticCurvePublicKey, node_id: str) -> str:
    """The node's certificate for `key`: CN node_id, SAN node_name(node_id), NODE_LIFETIME."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(ca_cert.subject)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + NODE_LIFETIME, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(node_name(node_id))]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def lifetime(cert_pem: str) -> tuple[float, float]:
    """(not before, not after) as Unix times."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    return cert.not_valid_before_utc.timestamp(), cert.not_valid_after_utc.timestamp()


def common_name(cert_pem: str) -> str:
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def key_sha256(key_pem: str) -> str:
    """sha256 of a private key's public key (DER), as `public_key_sha256` of its certificate."""
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def public_key_sha256(cert_pem: str) -> str:
    key = x509.load_pem_x509_certificate(cert_pem.encode()).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()
