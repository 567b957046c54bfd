"""The project's own trio Kafka client, built on the same codec as the broker.

Used by the command line, the tests, replication and the fault harness. One
``KafkaConnection`` is one TCP connection, over TLS when given an ``ssl.SSLContext``: it
negotiates versions with ApiVersions, logs in with SASL when given a login (the cluster's own,
``ClusterLogin``, or a user's, ``UserLogin``: PLAIN, SCRAM-SHA-256/512), then sends requests one
at a time (responses come back in order, so a lock is enough).
"""

from __future__ import annotations

import ssl
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from raftlog.client import socket_io
from raftlog.client.tls_stream import TlsStream
from raftlog.protocol import codec
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import API_VERSIONS
from raftlog.protocol.schemas_security import SASL_AUTHENTICATE, SASL_HANDSHAKE
from raftlog.security.scram import ScramClient, ScramError
from raftlog.security.session import CLUSTER_MECHANISM, ClusterCredentials

Stream = trio.SocketStream | TlsStream

_SIZE = struct.Struct(">i")
RESPONSE_BYTES_MAX = 256 * 1024 * 1024
REQUEST_TIMEOUT_S = 30.0


class KafkaClientError(Exception):
    """A broker answered with an error, or could not be reached."""


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    """'host:port,host:port' to a list of addresses."""
    out = []
    for item in servers.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise KafkaClientError(f"bad bootstrap address {item!r} (expected host:port)")
        out.append((host, int(port)))
    return out


@dataclass(frozen=True)
class ClusterLogin:
    """How a cluster member (a broker, an operator tool) proves it holds ``raft.secret``:
    SCRAM with credentials derived from it, as ``user``. ``extensions`` is read at each
    connect (a broker's current broker epoch)."""

    credentials: ClusterCredentials
    user: str
    extensions: Callable[[], dict[str, str]] = field(default=dict)
    # TLS for connections made with this login: a node's context for its peers' inter-broker
    # listener when that is SSL or SASL_SSL (None: plain TCP).
    tls: ssl.SSLContext | None = None

    @property
    def mechanism(self) -> str:
        return CLUSTER_MECHANISM


@dataclass(frozen=True)
class UserLogin:
    """A user's SASL login (a tool's ``sasl.username``/``sasl.password``): PLAIN,
    SCRAM-SHA-256 or SCRAM-SHA-512."""

    mechanism: str
    user: str
    password: str = field(repr=False)


Login = ClusterLogin | UserLogin


@dataclass(frozen=True)
class Security:
    """How a tool's connections are made (its ``--command-config``): over TLS with ``tls``,
    logged in with ``login``. The default is plain TCP without SASL."""

    login: Login | None = None
    tls: ssl.SSLContext | None = None


PLAINTEXT = Security()


class KafkaConnection:
    """One negotiated connection to one broker."""

    def __init__(self, stream: Stream, client_id: str) -> None:
        self._stream = stream
        self._client_id = client_id
        self._correlation_id = 0
        self._lock = trio.Lock()
        self.versions: dict[int, tuple[int, int]] = {}

    @classmethod
    async def connect(
        cls, host: str, port: int, *, client_id: str = "raftlog-cli", timeout_s: float = 5.0,
        login: Login | None = None, tls: ssl.SSLContext | None = None,
        security: Security | None = None,
    ) -> KafkaConnection:
        """Connects (over TLS with ``tls``, or with the ``ClusterLogin``'s own context),
        negotiates versions and logs in with ``login`` (``security`` gives both)."""
        if security is not None:
            login, tls = login or security.login, tls or security.tls
        if tls is None and isinstance(login, ClusterLogin):
            tls = login.tls
        try:
            with trio.fail_after(timeout_s):
                tcp = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError) as exc:
            raise KafkaClientError(f"cannot connect to {host}:{port}: {exc}") from exc
        stream: Stream = tcp
        if tls is not None:
            stream = TlsStream(tcp, tls, server_side=False, server_hostname=host)
            try:
                with trio.fail_after(timeout_s):
                    await stream.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError, OSError) as exc:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await tcp.aclose()
                cause = exc.__cause__ if isinstance(exc.__cause__, ssl.SSLError) else exc
                raise KafkaClientError(f"TLS handshake with {host}:{port} failed:"
                                       f" {getattr(cause, 'reason', None) or cause!r}") from exc
        connection = cls(stream, client_id)
        try:
            await connection._negotiate()
            if login is not None:
                await connection._authenticate(login, timeout_s)
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            raise
        return connection

    async def _authenticate(self, login: Login, timeout_s: float) -> None:
        """SaslHandshake v1 then SaslAuthenticate: one round trip for PLAIN, SCRAM's two."""
        shake = await self.request(SASL_HANDSHAKE, {"mechanism": login.mechanism},
                                   version=1, timeout_s=timeout_s)
        if shake.error_code:
            raise KafkaClientError(f"SaslHandshake refused: {ErrorCode(shake.error_code).name}"
                                   f" (server offers {list(shake.mechanisms)})")
        if isinstance(login, ClusterLogin):
            scram = login.credentials.client(login.user, login.extensions())
        elif login.mechanism == "PLAIN":
            token = f"\0{login.user}\0{login.password}".encode()
            await self._sasl_step(token, timeout_s)
            return
        else:
            scram = ScramClient(login.mechanism, login.user, login.password.encode())
        try:
            first = await self._sasl_step(scram.first(), timeout_s)
            final = await self._sasl_step(scram.final(first), timeout_s)
            scram.verify(final)
        except ScramError as exc:
            raise KafkaClientError(f"authentication as {login.user} failed: {exc}") from exc

    async def _sasl_step(self, auth_bytes: bytes, timeout_s: float) -> bytes:
        response = await self.request(SASL_AUTHENTICATE, {"auth_bytes": auth_bytes}, version=1,
                                      timeout_s=timeout_s)
        if response.error_code:
            raise KafkaClientError(f"SaslAuthenticate: {ErrorCode(response.error_code).name}:"
                                   f" {response.error_message}")
        return bytes(response.auth_bytes)

    async def _negotiate(self) -> None:
        response = await self.request(API_VERSIONS, {"client_software_name": "raftlog",
                                                     "client_software_version": "0.1"},
                                      version=3)
        if response.error_code == ErrorCode.UNSUPPORTED_VERSION:
            response = await self.request(API_VERSIONS, {}, version=0)
        if response.error_code:
            raise KafkaClientError(f"ApiVersions failed with error {response.error_code}")
        self.versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}

    def pick_version(self, api: Api) -> int:
        broker = self.versions.get(api.key)
        if broker is None:
            raise KafkaClientError(f"broker does not support {api.name}")
        version = min(api.max_version, broker[1])
        if version < max(api.min_version, broker[0]):
            raise KafkaClientError(f"no common version of {api.name}")
        return version

    async def request(
        self,
        api: Api,
        body: Mapping[str, Any],
        *,
        version: int | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Struct:
        if version is None:
            version = self.pick_version(api)
        async with self._lock:
            self._correlation_id += 1
            correlation_id = self._correlation_id
            header = codec.RequestHeader(api.key, version, correlation_id, self._client_id)
            flexible = api.is_flexible(version)
            payload = codec.encode_request_header(header, flexible) + codec.encode_bytes(
                api, version, body, is_request=True)
            try:
                with trio.fail_after(timeout_s):
                    await self._send(_SIZE.pack(len(payload)) + payload)
                    frame = await self._receive_frame()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise KafkaClientError(f"connection lost: {exc}") from exc
            except trio.TooSlowError as exc:
                raise KafkaClientError(f"{api.name} timed out after {timeout_s} s") from exc
        # KIP-511: the ApiVersions response header is always v0.
        header_flexible = flexible and api is not API_VERSIONS
        received_id, pos = codec.decode_response_header(frame, header_flexible)
        if received_id != correlation_id:
            raise KafkaClientError(f"correlation id {received_id} != {correlation_id}")
        if api is API_VERSIONS and version > 0 and _is_v0_error(frame[pos:]):
            return codec.decode(api, 0, frame[pos:], is_request=False)
        return codec.decode(api, version, frame[pos:], is_request=False)

    async def _send(self, data: bytes) -> None:
        if isinstance(self._stream, TlsStream):
            await self._stream.send_all(data)
        else:
            await socket_io.send_all(self._stream.socket, data)

    async def _receive_frame(self) -> memoryview:
        prefix = await self._receive_exactly(4)
        (size,) = _SIZE.unpack(prefix)
        if not 4 <= size <= RESPONSE_BYTES_MAX:
            raise KafkaClientError(f"response frame of {size} bytes")
        return memoryview(await self._receive_exactly(size))

    async def _receive_exactly(self, size: int) -> bytearray:
        # recv_into one buffer of the frame's size: a follower's fetch answers are megabytes,
        # and receive_some would allocate a max-size bytes per call and copy it again.
        buf = bytearray(size)
        view = memoryview(buf)
        received = 0
        if isinstance(self._stream, TlsStream):
            while received < size:
                count = await self._stream.recv_into(view[received:], size - received)
                if count == 0:
                    raise KafkaClientError("broker closed the connection")
                received += count
            return buf
        sock = self._stream.socket
        while received < size:
            count = await socket_io.recv_into(sock, view[received:], size - received)
            if count == 0:
                raise KafkaClientError("broker closed the connection")
            received += count
        return buf

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> KafkaConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _is_v0_error(body: memoryview) -> bool:
    """An ApiVersions error answer is a v0 body whatever version was asked (KIP-511)."""
    return len(body) >= 2 and bytes(body[0:2]) == b"\x00\x23"


async def connect_any(bootstrap: str, *, client_id: str = "raftlog-cli",
                      login: Login | None = None, tls: ssl.SSLContext | None = None,
                      security: Security | None = None) -> KafkaConnection:
    """Connects to the first reachable bootstrap server."""
    errors = []
    for host, port in parse_bootstrap(bootstrap):
        try:
            return await KafkaConnection.connect(host, port, client_id=client_id, login=login,
                                                 tls=tls, security=security)
        except KafkaClientError as exc:
            errors.append(str(exc))
    raise KafkaClientError("; ".join(errors))
