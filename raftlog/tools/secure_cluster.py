"""``raftlog cluster up --secure``: what a local cluster needs to speak TLS and SCRAM.

Made once, when the cluster directory is created (``DIR/secure/``):

* a local CA (``ca.pem``; its key ``ca-key.pem`` mode 0600) made with ``cryptography``;
* one certificate per node, SAN ``localhost`` and ``127.0.0.1``, usable as server and as client
  certificate (``node-<i>.pem``: key, certificate, CA), and a client certificate
  (``client-cert.pem``, ``client-key.pem``, CN=admin);
* an admin SCRAM-SHA-512 user with a random password (``admin.password``, 0600), written to
  every node's bootstrap file as ``raftlog format --add-scram`` does;
* ``client.properties``: librdkafka's property names (bootstrap.servers, security.protocol,
  sasl.*, ssl.*), which confluent-kafka and kcat (``-F``) take as is, and so do the ``raftlog``
  tools' ``--command-config``.

Every node then has one SASL_SSL listener for clients and for the other nodes (TLS with the
local CA, the nodes log in with SCRAM derived from ``raft.secret``); the controller listener
carries the Raft transport, encrypted with ``raft.secret`` (no TLS).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raftlog.controller.scram_bootstrap import parse_add_scram, write_bootstrap

SECURE_DIR: Final = "secure"
CLIENT_PROPERTIES: Final = "client.properties"
ADMIN_USER: Final = "admin"
LISTENER: Final = "SASL_SSL"
STANDARD_AUTHORIZER: Final = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
VALID_DAYS: Final = 825
_DAY: Final = datetime.timedelta(days=1)


def secure_directory(data_dir: Path) -> Path:
    return data_dir / SECURE_DIR


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "raftlog local cluster"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
                 issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False,
                 server: bool = False, host: str | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - _DAY).not_valid_after(now + VALID_DAYS * _DAY)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        return builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True).sign(
                issuer_key, hashes.SHA256())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:  # a node's certificate: its listener's, and its client one towards its peers
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        if host not in (None, "localhost", "127.0.0.1"):
            names.append(_general_name(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False).sign(
        issuer_key, hashes.SHA256())


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def make_secure_material(data_dir: Path, node_ids: range, bootstrap: str,
                         metadata_dirs: list[Path],
                         node_hosts: Mapping[int, str] | None = None) -> Path:
    """Writes the CA, the certificates, the admin user's bootstrap and ``client.properties``
    (returned); a directory that has them already is left as it is. Node certificates name
    localhost and 127.0.0.1, and each node's address in ``node_hosts`` (other machines, or
    network namespaces), so host-name verification passes wherever the node listens."""
    directory = secure_directory(data_dir)
    properties = directory / CLIENT_PROPERTIES
    if properties.exists():
        return properties
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_name = _key(), _name("raftlog local CA")
    ca = _certificate(ca_name, ca_key, ca_name, ca_key, ca=True)
    _write(directory / "ca.pem", _pem(ca))
    _write(directory / "ca-key.pem", _pem_key(ca_key), private=True)
    for node_id in node_ids:
        key = _key()
        cert = _certificate(_name(f"node-{node_id}"), key, ca_name, ca_key, server=True,
                            host=(node_hosts or {}).get(node_id))
        _write(directory / f"node-{node_id}.pem", _pem_key(key) + _pem(cert) + _pem(ca),
               private=True)
    client_key = _key()
    client = _certificate(_name(ADMIN_USER), client_key, ca_name, ca_key)
    _write(directory / "client-cert.pem", _pem(client))
    _write(directory / "client-key.pem", _pem_key(client_key), private=True)
    password = secrets.token_urlsafe(24)
    _write(directory / "admin.password", f"{password}\n".encode(), private=True)
    entry = parse_add_scram(f"SCRAM-SHA-512=[name={ADMIN_USER},password={password}]")
    for metadata_dir in metadata_dirs:
        write_bootstrap(metadata_dir, [entry])
    lines = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": ADMIN_USER,
        "sasl.password": password,
        "ssl.ca.location": str((directory / "ca.pem").resolve()),
        "ssl.certificate.location": str((directory / "client-cert.pem").resolve()),
        "ssl.key.location": str((directory / "client-key.pem").resolve()),
    }
    _write(properties, "".join(f"{k}={v}\n" for k, v in lines.items()).encode(), private=True)
    return properties


def secure_node_properties(data_dir: Path, node_id: int, host: str, kafka_port: int,
                           controller_port: int) -> dict[str, str]:
    """The properties that put a node's Kafka listener on SASL_SSL (clients and nodes)."""
    directory = secure_directory(data_dir).resolve()
    return {
        "listeners": f"{LISTENER}://{host}:{kafka_port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"{LISTENER}://{host}:{kafka_port}",
        "listener.security.protocol.map": f"{LISTENER}:SASL_SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": LISTENER,
        "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(directory / f"node-{node_id}.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(directory / "ca.pem"),
        # A client certificate, when one is presented, must be signed by the local CA.
        "ssl.client.auth": "requested",
        # ACLs on: the admin user may do anything, anyone else only what an ACL allows.
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": f"User:{ADMIN_USER}",
    }
