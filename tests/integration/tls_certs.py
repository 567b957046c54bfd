"""Throwaway certificates for TLS tests and benches, made with ``cryptography``: a CA, a server
certificate for 127.0.0.1/localhost, client certificates, and a second CA nobody trusts."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certs:
    ca: Path  # the trusted CA's certificate
    server: Path  # the server's key and certificate chain, one PEM file
    server_cert: Path
    server_key: Path
    client_cert: Path  # CN=alice,OU=eng,O=acme, signed by the trusted CA
    client_key: Path
    untrusted_ca: Path
    untrusted_cert: Path  # CN=mallory, signed by the untrusted CA
    untrusted_key: Path


_ONE_DAY = datetime.timedelta(days=1)


def _name(**attributes: str) -> x509.Name:
    oids = {"O": NameOID.ORGANIZATION_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
            "CN": NameOID.COMMON_NAME}
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in attributes.items()])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _build(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
           issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False,
           server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - _ONE_DAY).not_valid_after(now + 30 * _ONE_DAY)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem_key(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password
        else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             encryption)


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_certs(directory: Path, key_password: bytes | None = None) -> Certs:
    """Writes every certificate and key under ``directory``; the server key is encrypted with
    ``key_password`` when given (ssl.key.password)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_name = _key(), _name(O="raftlog-test", CN="test CA")
    ca = _build(ca_name, ca_key, ca_name, ca_key, ca=True)
    server_key = _key()
    server = _build(_name(O="raftlog-test", CN="localhost"), server_key, ca_name, ca_key,
                    server=True)
    client_key = _key()
    client = _build(_name(O="acme", OU="eng", CN="alice"), client_key, ca_name, ca_key)
    other_key, other_name = _key(), _name(O="elsewhere", CN="untrusted CA")
    other_ca = _build(other_name, other_key, other_name, other_key, ca=True)
    mallory_key = _key()
    mallory = _build(_name(CN="mallory"), mallory_key, other_name, other_key)

    def write(name: str, data: bytes) -> Path:
        path = directory / name
        path.write_bytes(data)
        return path

    return Certs(
        ca=write("ca.pem", _pem_cert(ca)),
        server=write("server.pem", _pem_key(server_key, key_password) + _pem_cert(server)
                     + _pem_cert(ca)),
        server_cert=write("server-cert.pem", _pem_cert(server) + _pem_cert(ca)),
        server_key=write("server-key.pem", _pem_key(server_key, key_password)),
        client_cert=write("client-cert.pem", _pem_cert(client)),
        client_key=write("client-key.pem", _pem_key(client_key)),
        untrusted_ca=write("untrusted-ca.pem", _pem_cert(other_ca)),
        untrusted_cert=write("mallory-cert.pem", _pem_cert(mallory)),
        untrusted_key=write("mallory-key.pem", _pem_key(mallory_key)),
    )
