"""Test certificates made on the spot with `cryptography`: a CA, a server, clients."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Pem:
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(dir_: Path, stem: str, cert, key) -> Pem:
    c, k = dir_ / f"{stem}.crt", dir_ / f"{stem}.key"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return Pem(c, k)


class Authority:
    def __init__(self, dir_: Path, name: str) -> None:
        self.dir, self.name = dir_, name
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.pem = _write(dir_, name, self.cert, self.key)

    def issue(self, stem: str, cn: str, server: bool, dns: tuple[str, ...] = (), uris: tuple[str, ...] = ()) -> Pem:
        """A certificate for `cn`; a server one names localhost and 127.0.0.1, a client one
        the SAN DNS names and URIs given (identities a controller may bind to host ids)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1)))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        elif dns or uris:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName(d) for d in dns] + [x509.UniformResourceIdentifier(u) for u in uris]), critical=False)
        return _write(self.dir, stem, builder.sign(self.key, hashes.SHA256()), key)
