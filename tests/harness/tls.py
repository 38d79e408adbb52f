"""A throwaway certificate authority for TLS tests: a server certificate and client ones.

    pki = Pki.create(tmp_path)
    pki.ca              # the CA's PEM file (trust roots for both sides)
    pki.server          # Pem(cert, key): SANs localhost and 127.0.0.1
    pki.server_cert("cp.internal")                                      # another name
    pki.client("exec-1", executor_pool="pool-a", workspaces=["ws-a"])  # an executor's
    pki.client("alice")                                                 # an ordinary one
    Pki.create(other_dir).client("mallory", executor_pool="pool-a")     # another CA's

Keys are P-256 (fast to make); certificates are valid for a day.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes]:
        """(key, certificate) bytes, as grpc's credential functions take them."""
        return self.key.read_bytes(), self.cert.read_bytes()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


class Pki:
    """A CA that issues certificates into `directory`."""

    def __init__(self, directory: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate):
        self.directory = directory
        self._key = key
        self._cert = cert
        self.ca = directory / "ca.pem"
        self.ca.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.server = self.server_cert("localhost", "127.0.0.1")

    def server_cert(self, *names: str) -> Pem:
        """A server certificate for DNS names and IP addresses (the first is its CN)."""
        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        return self._issue(f"server-{names[0]}", names[0], sans, ExtendedKeyUsageOID.SERVER_AUTH)

    @classmethod
    def create(cls, directory: Path, name: str = "agentrun test CA") -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(directory, key, cert)

    def client(
        self,
        common_name: str,
        *,
        executor_pool: str | None = None,
        workspaces: Iterable[str] = (),
        uris: Iterable[str] = (),
    ) -> Pem:
        """A client certificate; an executor's when `executor_pool` is given."""
        names: list[x509.GeneralName] = [x509.DNSName(f"{common_name}.clients.test")]
        marker = [f"agentrun://executor/{executor_pool}"] if executor_pool else []
        scope = [f"agentrun://workspace/{ws}" for ws in workspaces]
        for uri in (*marker, *scope, *uris):
            names.append(x509.UniformResourceIdentifier(uri))
        return self._issue(common_name, common_name, names, ExtendedKeyUsageOID.CLIENT_AUTH)

    def _issue(
        self,
        file_stem: str,
        common_name: str,
        sans: list[x509.GeneralName],
        usage: x509.ObjectIdentifier,
    ) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
            .sign(self._key, hashes.SHA256())
        )
        pem = Pem(self.directory / f"{file_stem}.pem", self.directory / f"{file_stem}.key")
        pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, pem.key)
        return pem
