"""A self-signed certificate and key for tests of TLS (cryptography, generated per test)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path


def self_signed(directory: Path, name: str = "localhost", ip: str | None = "127.0.0.1") -> tuple[Path, Path]:
    """cert.pem and key.pem in `directory`: an EC key and a certificate for DNS `name` (and `ip`), a day long."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    alt_names = [x509.DNSName(name)] + ([x509.IPAddress(ipaddress.ip_address(ip))] if ip else [])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = Path(directory) / "cert.pem", Path(directory) / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path
