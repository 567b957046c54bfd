"""TLS for SSL listeners: the ``ssl.SSLContext`` built from a listener's ``TlsSettings``, the
server-side handshake (bounded in time, a failure costs one connection and one log line), the
client certificate's principal, and the byte paths a ``TlsStream`` needs.

A TLS stream cannot take ``os.sendfile`` (no kernel TLS here): a fetch response's file regions
are read with ``os.preadv`` into one buffer of at most ``COPY_BUFFER_BYTES`` per response,
together with the bytes around them, and each full buffer goes to ``send_all`` (one TLS
encryption pass, no further copy in Python).
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import trio

from raftlog.client.tls_stream import TlsStream
from raftlog.config.properties import ConfigError
from raftlog.config.tls import TlsSettings
from raftlog.security.principal import PrincipalMapper, PrincipalMappingError, subject_dn
from raftlog.security.session import KafkaPrincipal

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S: Final = 10.0
COPY_BUFFER_BYTES: Final = 1 << 20
_VERSIONS: Final = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


@dataclass(frozen=True)
class TlsListener:
    """What an SSL listener needs per connection: its context and its principal mapper."""

    name: str
    context: ssl.SSLContext
    mapper: PrincipalMapper


def build_tls_listener(settings: TlsSettings) -> TlsListener:
    """The listener's context; a key, certificate or CA file that cannot be loaded is a
    ConfigError naming the property."""
    return TlsListener(settings.listener, build_server_context(settings),
                       PrincipalMapper(settings.principal_rules))


def build_server_context(settings: TlsSettings) -> ssl.SSLContext:
    where = f"(listener {settings.listener})"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_VERSIONS[p] for p in settings.protocols)
    context.minimum_version, context.maximum_version = versions[0], versions[-1]
    if settings.cipher_suites:
        try:
            context.set_ciphers(":".join(settings.cipher_suites))
        except ssl.SSLError as exc:
            raise ConfigError(f"ssl.cipher.suites {where}",
                              f"no usable cipher in {list(settings.cipher_suites)}") from exc
    _load_keystore(context, settings, where)
    if settings.has_truststore:
        try:
            if settings.truststore_location:
                context.load_verify_locations(cafile=settings.truststore_location)
            else:
                context.load_verify_locations(cadata=settings.truststore_certificates)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"ssl.truststore.location {where}",
                              f"cannot load CA certificates: {exc}") from exc
    context.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                           "required": ssl.CERT_REQUIRED}[settings.client_auth]
    return context


def _load_keystore(context: ssl.SSLContext, settings: TlsSettings, where: str) -> None:
    password = settings.key_password
    try:
        if settings.keystore_location:
            context.load_cert_chain(settings.keystore_location, password=password)
            return
        # Inline PEM: OpenSSL loads chains from files only, so through a private temporary
        # file that is gone once loaded.
        assert settings.keystore_chain is not None and settings.keystore_key is not None
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as pem:
            pem.write(f"{settings.keystore_key.strip()}\n{settings.keystore_chain.strip()}\n")
            pem.flush()
            context.load_cert_chain(pem.name, password=password)
    except (OSError, ssl.SSLError) as exc:
        name = "ssl.keystore.location" if settings.keystore_location else "ssl.keystore.key"
        raise ConfigError(f"{name} {where}", f"cannot load the key and certificate chain"
                          f" (wrong ssl.key.password, or not PEM?): {exc}") from exc


async def accept_tls(
    tcp: trio.SocketStream, tls: TlsListener, peer: str
) -> tuple[TlsStream, KafkaPrincipal | None] | None:
    """The TLS handshake as the server, within HANDSHAKE_TIMEOUT_S. Returns the stream and the
    client certificate's principal (None without a certificate), or None after logging why
    the connection is refused (the caller closes the TCP stream)."""
    stream = TlsStream(tcp, tls.context, server_side=True)
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            await stream.do_handshake()
    except trio.TooSlowError:
        log.warning("TLS handshake with %s on %s: no handshake within %g s", peer, tls.name,
                    HANDSHAKE_TIMEOUT_S)
        return None
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        log.warning("TLS handshake with %s on %s failed: %s", peer, tls.name,
                    _reason(exc))
        return None
    der = stream.getpeercert(binary_form=True)
    if not der:
        return stream, None
    try:
        dn = subject_dn(der)
        name = tls.mapper.name_of(dn)
    except (PrincipalMappingError, ValueError) as exc:
        log.warning("TLS client %s on %s refused: %s", peer, tls.name, exc)
        await _close_quietly(stream)
        return None
    return stream, KafkaPrincipal("User", name)


def _reason(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLError):
        return cause.reason or str(cause)
    if isinstance(exc, trio.BrokenResourceError) and cause is None:
        return "peer closed the connection during the handshake"
    return str(cause or exc) or type(exc).__name__


async def _close_quietly(stream: trio.abc.AsyncResource) -> None:
    with trio.move_on_after(1) as cleanup:
        cleanup.shield = True
        with contextlib.suppress(trio.BrokenResourceError, OSError):
            await stream.aclose()


async def send_copying(stream: trio.abc.SendStream, chunks: Sequence[Any]) -> None:
    """Sends bytes chunks and file regions (``fd``, ``position``, ``size_bytes``) through one
    buffer of at most COPY_BUFFER_BYTES: regions are read into it with ``os.preadv`` next to
    the bytes around them, and every full buffer is one ``send_all``."""
    total = sum(len(c) if isinstance(c, bytes | bytearray | memoryview) else c.size_bytes
                for c in chunks)
    buffer = memoryview(bytearray(max(1, min(total, COPY_BUFFER_BYTES))))
    filled = 0
    for chunk in chunks:
        if isinstance(chunk, bytes | bytearray | memoryview):
            data = memoryview(chunk).cast("B")
            while data:
                count = min(len(data), len(buffer) - filled)
                buffer[filled:filled + count] = data[:count]
                filled, data = filled + count, data[count:]
                if filled == len(buffer):
                    await stream.send_all(buffer)
                    filled = 0
            continue
        position, remaining = chunk.position, chunk.size_bytes
        while remaining > 0:
            count = os.preadv(chunk.fd, [buffer[filled:filled + min(remaining,
                                                                     len(buffer) - filled)]],
                              position)
            if count == 0:
                raise EOFError("file region shorter than expected (segment truncated?)")
            filled, position, remaining = filled + count, position + count, remaining - count
            if filled == len(buffer):
                await stream.send_all(buffer)
                filled = 0
    if filled:
        await stream.send_all(buffer[:filled])
