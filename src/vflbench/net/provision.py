"""Certificates for mutual TLS: a per-project CA and one certificate and key per party.

:func:`provision` writes::

    DIR/ca.pem            the project's CA certificate (public)
    DIR/ca-key.pem        the CA's private key: stays with whoever provisions; never handed to a party
    DIR/<party>/ca.pem    the CA certificate again, for the party to verify its peers
    DIR/<party>/cert.pem  the party's certificate: CN and DNS subject-alternative name = the party's name
    DIR/<party>/key.pem   the party's private key (unencrypted: gRPC cannot load encrypted keys)

Each party receives only its own directory. A peer's identity is its certificate's name, checked
by TLS against the project CA: a certificate from another CA fails the handshake.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vflbench.errors import ConfigError
from vflbench.net.policy import role_of


@dataclass(frozen=True)
class Credentials:
    """What a party needs for mutual TLS: the project CA, its own certificate and key (PEM bytes), its name."""

    name: str
    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def load(cls, directory: Path) -> Credentials:
        """A party's directory as :func:`provision` wrote it; its name is read from its certificate."""
        paths = [directory / f for f in ("ca.pem", "cert.pem", "key.pem")]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise ConfigError(
                f"credentials in {directory} are incomplete: missing {', '.join(missing)} "
                "(write them with `vflbench net provision`)"
            )
        ca, cert, key = (p.read_bytes() for p in paths)
        return cls(certificate_name(cert), ca, cert, key)


def certificate_name(cert_pem: bytes) -> str:
    """The party name in a certificate (its common name)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise ConfigError(f"a party certificate must have exactly one common name, found {len(names)}")
    return str(names[0].value)


def _name(project: str, common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, project), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, *, secret: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def provision(
    directory: Path,
    parties: Sequence[str],
    *,
    project: str = "vflbench",
    days: int = 365,
    now: datetime.datetime | None = None,
) -> None:
    """Write a new CA and one certificate and key per party in ``parties`` under ``directory`` (see the module
    docstring). Refuses to overwrite an existing CA or party directory; ``days``: validity of every certificate."""
    if not parties:
        raise ConfigError("provision needs at least one party name (e.g. --parties active,passive_1,dealer)")
    for name in parties:
        role_of(name)
    if len(set(parties)) != len(parties):
        raise ConfigError(f"party names must be distinct, got {', '.join(parties)}")
    if days < 1:
        raise ConfigError(f"certificates must be valid for at least one day, got days={days}")
    clashes = [
        str(p)
        for p in (directory / "ca.pem", directory / "ca-key.pem", *(directory / n for n in parties))
        if p.exists()
    ]
    if clashes:
        raise ConfigError(
            f"{', '.join(clashes)} already exist; provision into a new directory (a second CA would "
            "not be trusted by the parties of the first)"
        )
    start = (now or datetime.datetime.now(datetime.timezone.utc)) - datetime.timedelta(minutes=5)
    end = start + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(project, f"{project} vflbench CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / "ca.pem", ca_pem, secret=False)
    _write(directory / "ca-key.pem", _pem_key(ca_key), secret=True)
    for name in parties:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(project, name))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        party_dir = directory / name
        party_dir.mkdir(mode=0o700)
        _write(party_dir / "ca.pem", ca_pem, secret=False)
        _write(party_dir / "cert.pem", cert.public_bytes(serialization.Encoding.PEM), secret=False)
        _write(party_dir / "key.pem", _pem_key(key), secret=True)
