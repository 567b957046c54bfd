"""KIP-590 request forwarding: wrapping a client's admin request in an Envelope (API 58).

A node that is not the controller forwards an admin request it cannot decide by encoding it,
header and body, into an EnvelopeRequest's ``request_data`` and sending that to the
controller over the broker-to-controller channel. The controller opens the envelope, handles
the inner request exactly as if a client had sent it (but marked as forwarded, so it is never
forwarded again) and returns the inner response, header and body, in the EnvelopeResponse's
``response_data``. Only an Envelope counts as forwarded: a client's own client.id means
nothing. An envelope-level error (NOT_CONTROLLER, INVALID_REQUEST) comes back in the
EnvelopeResponse's ``error_code`` with no ``response_data``.

Everything here is pure (no I/O): the handlers in :mod:`raftlog.broker.controller_apis` call it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from raftlog.protocol import codec
from raftlog.protocol.api_table import APIS_BY_KEY
from raftlog.protocol.codec import Api, DecodeError, Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import (
    ALTER_CONFIGS,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    INCREMENTAL_ALTER_CONFIGS,
)
from raftlog.protocol.schemas_quota import ALTER_CLIENT_QUOTAS
from raftlog.protocol.schemas_security import (
    ALTER_USER_SCRAM_CREDENTIALS,
    CREATE_ACLS,
    DELETE_ACLS,
)

ENVELOPE_VERSION: Final = 0
# The admin APIs a controller accepts inside an Envelope (Kafka's ApiKeys.forwardable among the
# APIs raftlog serves). An Envelope is not one of them: an envelope is never nested.
FORWARDABLE_API_KEYS: Final = frozenset(
    api.key for api in (CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS, ALTER_CONFIGS,
                        INCREMENTAL_ALTER_CONFIGS, ALTER_USER_SCRAM_CREDENTIALS, CREATE_ACLS,
                        DELETE_ACLS, ALTER_CLIENT_QUOTAS)
)
UNKNOWN_CLIENT_ADDRESS: Final = bytes(4)  # 0.0.0.0: the peer's address was not known


class EnvelopeError(Exception):
    """An envelope that cannot be built, opened or unwrapped; ``error_code`` is Kafka's."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True)
class ForwardedRequest:
    """The request found inside an Envelope."""

    api: Api
    header: codec.RequestHeader
    body: Struct
    client_host: str


def client_address(peer: str) -> bytes:
    """The IP address bytes of a ``host:port`` peer name (KIP-590's ClientHostAddress)."""
    host = peer.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).packed
    except ValueError:
        return UNKNOWN_CLIENT_ADDRESS


def wrap_request(
    api: Api,
    version: int,
    body: Mapping[str, Any] | Struct,
    *,
    correlation_id: int,
    client_id: str | None,
    client_host: bytes,
    request_bytes_max: int,
) -> dict[str, Any]:
    """The EnvelopeRequest body carrying ``body`` with the original client's header fields.

    Raises:
        EnvelopeError: the encoded request is larger than ``request_bytes_max``.
    """
    header = codec.RequestHeader(api.key, version, correlation_id, client_id)
    data = codec.encode_request_header(header, api.is_flexible(version)) + codec.encode_bytes(
        api, version, body, is_request=True)
    if len(data) > request_bytes_max:
        raise EnvelopeError(ErrorCode.INVALID_REQUEST,
                            f"{api.name} of {len(data)} bytes is too large to forward")
    # raftlog has no authentication, hence no principal to pass on.
    return {"request_data": data, "request_principal": None, "client_host_address": client_host}


def open_request(envelope: Struct, *, request_bytes_max: int) -> ForwardedRequest:
    """The request inside an EnvelopeRequest, checked as the listener checks a frame.

    Raises:
        EnvelopeError: too large, malformed, an unsupported version, or an API that is not
            forwardable (an Envelope among them).
    """
    data = memoryview(envelope.request_data)
    if len(data) > request_bytes_max:
        raise EnvelopeError(ErrorCode.INVALID_REQUEST,
                            f"forwarded request of {len(data)} bytes exceeds "
                            f"{request_bytes_max} (socket.request.max.bytes)")
    host = _client_host(envelope.client_host_address)
    try:
        key, version, _ = codec.peek_request_header(data)
        api = APIS_BY_KEY.get(key)
        if api is None or key not in FORWARDABLE_API_KEYS:
            name = f"key {key}" if api is None else api.name
            raise EnvelopeError(ErrorCode.INVALID_REQUEST,
                                f"API {name} is not enabled or is not eligible for forwarding")
        if not api.supports(version):
            raise EnvelopeError(ErrorCode.UNSUPPORTED_VERSION,
                                f"forwarded {api.name} v{version} is not supported")
        header, pos = codec.decode_request_header(data, api.is_flexible(version))
        body = codec.decode(api, version, data[pos:], is_request=True, allow_trailing=True)
    except DecodeError as exc:
        raise EnvelopeError(ErrorCode.INVALID_REQUEST, f"malformed forwarded request: {exc}"
                            ) from exc
    return ForwardedRequest(api, header, body, host)


def _client_host(address: memoryview | bytes) -> str:
    try:
        return str(ipaddress.ip_address(bytes(address)))
    except ValueError as exc:  # Kafka's InetAddress.getByAddress takes 4 or 16 bytes only
        raise EnvelopeError(ErrorCode.INVALID_REQUEST,
                            "Failed to parse client address from envelope") from exc


def seal_response(request: ForwardedRequest, body: Mapping[str, Any]) -> dict[str, Any]:
    """The EnvelopeResponse body carrying the inner response, header and body."""
    api, header = request.api, request.header
    version = header.api_version
    data = codec.encode_response_header(header.correlation_id, api.is_flexible(version)) + \
        codec.encode_bytes(api, version, body)
    return {"response_data": data, "error_code": ErrorCode.NONE}


def refusal(error_code: int) -> dict[str, Any]:
    """An EnvelopeResponse that refuses the envelope itself (no inner response)."""
    return {"response_data": None, "error_code": error_code}


def unwrap_response(api: Api, version: int, correlation_id: int, envelope: Struct) -> Struct:
    """The inner response of an EnvelopeResponse to a request wrapped by :func:`wrap_request`.

    Raises:
        EnvelopeError: the envelope was refused, or its response is missing or malformed.
    """
    if envelope.error_code != ErrorCode.NONE:
        raise EnvelopeError(envelope.error_code,
                            f"the controller refused the forwarded {api.name}")
    if envelope.response_data is None:
        raise EnvelopeError(ErrorCode.UNKNOWN_SERVER_ERROR,
                            f"the controller sent no response to the forwarded {api.name}")
    data = memoryview(envelope.response_data)
    try:
        received, pos = codec.decode_response_header(data, api.is_flexible(version))
        if received != correlation_id:
            raise EnvelopeError(ErrorCode.UNKNOWN_SERVER_ERROR,
                                f"forwarded {api.name}: correlation id {received} "
                                f"!= {correlation_id}")
        return codec.decode(api, version, data[pos:], is_request=False)
    except DecodeError as exc:
        raise EnvelopeError(ErrorCode.UNKNOWN_SERVER_ERROR,
                            f"malformed response to the forwarded {api.name}: {exc}") from exc
