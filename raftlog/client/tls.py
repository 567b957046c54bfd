"""TLS for the project's own client connections: an ``ssl.SSLContext`` from client settings
(a tool's ``--command-config``, ``raftlog.config.client_properties``) or from a node's own
inter-broker listener (``raftlog.config.tls``: its truststore verifies the peer node, its
keystore is the node's client certificate for listeners that require one).
"""

from __future__ import annotations

import ssl

from raftlog.config.client_properties import ClientTlsSettings
from raftlog.config.properties import ConfigError
from raftlog.config.tls import TlsSettings


def client_context(settings: ClientTlsSettings) -> ssl.SSLContext:
    """A client context: verifies the broker's certificate against ``ca_location`` (the
    system's CAs without one) and its host name unless told not to; presents the client
    certificate when one is given.

    Raises:
        ConfigError: a CA, certificate or key that cannot be loaded (naming the property).
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if settings.ca_location:
            context.load_verify_locations(cafile=settings.ca_location)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("ssl.ca.location", f"cannot load {settings.ca_location}: {exc}"
                          ) from exc
    context.check_hostname = settings.check_hostname
    if not settings.verify:
        context.verify_mode = ssl.CERT_NONE
    if settings.certificate_location:
        try:
            context.load_cert_chain(settings.certificate_location, settings.key_location,
                                    password=settings.key_password)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("ssl.certificate.location", f"cannot load the client certificate"
                              f" and key (wrong ssl.key.password?): {exc}") from exc
    return context


def node_client_context(settings: TlsSettings) -> ssl.SSLContext:
    """The context a node's own connections to its peers' ``settings.listener`` use: the
    listener's truststore verifies the peer (and, with ``ssl.endpoint.identification.algorithm``
    https, its host name), the listener's keystore is the node's client certificate."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    where = f"(listener {settings.listener}, node-to-node)"
    try:
        if settings.truststore_location:
            context.load_verify_locations(cafile=settings.truststore_location)
        elif settings.truststore_certificates:
            context.load_verify_locations(cadata=settings.truststore_certificates)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"ssl.truststore.location {where}", str(exc)) from exc
    context.check_hostname = settings.endpoint_identification == "https"
    if settings.keystore_location:
        try:
            context.load_cert_chain(settings.keystore_location,
                                    password=settings.key_password)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"ssl.keystore.location {where}", str(exc)) from exc
    elif settings.keystore_chain and settings.keystore_key:
        import tempfile  # inline PEM: OpenSSL loads chains from files only

        with tempfile.NamedTemporaryFile("w", suffix=".pem") as pem:
            pem.write(f"{settings.keystore_key.strip()}\n{settings.keystore_chain.strip()}\n")
            pem.flush()
            try:
                context.load_cert_chain(pem.name, password=settings.key_password)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"ssl.keystore.key {where}", str(exc)) from exc
    return context
