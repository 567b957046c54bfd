"""pysyncobj's TCP transport with raftlog's guards on the Raft port (tick thread only).

How pysyncobj 0.3.17 reads a connection (tcp_connection.py): on every readable poll event it
calls ``recv`` until the socket would block, appending each chunk to a ``bytes`` buffer (a copy
of the whole buffer per chunk); only then does it look for complete frames (a native 4-byte
signed length, then that many bytes), decrypt them with the Fernet key and unpickle them. There
is no limit: a stranger that declares a 2^31-1-byte frame and keeps sending is buffered for as
long as it sends, and the tick thread stays inside that read loop meanwhile (ever slower, as
each chunk copies the buffer). Measured in this process: 16 MiB of junk held a leader's tick
thread for 2.4 s, so it sent no heartbeats and the followers elected a new leader (term +1);
on a real cluster 48 MiB took 18 s to read and grew the node by 95 MiB. What this module adds:

* **A cap on every frame** (:data:`RAFT_MESSAGE_MAX_BYTES`). A larger declared length closes
  the connection at its header, before its body is buffered, with a log line naming the peer.
* **A small cap until the peer proves the secret** (:data:`HANDSHAKE_MESSAGE_MAX_BYTES`). A
  connection is proven once a message on it decrypts with the Fernet key derived from
  ``raft.secret``. pysyncobj's first message on a connection is the sender's 32-byte random
  key (228 bytes encrypted); the next ones are the sender's address or an observer's
  ``readonly:<id>``, sent only after the other side has answered the first.
* **Bounded work per poll**: a connection stops reading once a frame is complete or
  :data:`READ_PER_POLL_MAX_BYTES` arrived, so no peer holds the tick thread in its read loop;
  the buffer is a ``bytearray`` so appending is not quadratic.
* **Handshake deadline**: an incoming connection that has not proved the secret within
  :data:`HANDSHAKE_TIMEOUT_S` is closed, and at most :data:`UNPROVEN_CONNECTIONS_MAX` may wait
  at once (a new one closes the oldest), so strangers cannot hold the node's descriptors.
* Authentication failures are logged (pysyncobj drops them silently); every refusal is logged
  at most once a second per kind, with a count of the ones not logged.
* Observers (read-only members) announce their node id (``readonly:<id>``).

A replayed first message (captured from the network) counts as proof; its sender still cannot
produce the second, which must carry the random key this node sent encrypted. The Raft port
belongs on a private interface all the same.
"""

from __future__ import annotations

import functools
import logging
import struct
import time
from collections import Counter
from typing import Any, Final

from cryptography.fernet import InvalidToken
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.node import Node
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.transport import TCPTransport

logger = logging.getLogger(__name__)

OBSERVER_PREFIX: Final = "readonly:"
# Why 1 s between log lines of one kind: an attacker must not be able to flood the log.
REFUSAL_LOG_INTERVAL_S: Final = 1.0

MIB: Final = 1 << 20
# pysyncobj's frame header: struct.pack('i', len(data)), native byte order, signed.
FRAME_HEADER: Final = struct.Struct("i")
# A metadata command (one Raft entry) is at most this big: RaftQuorum.propose refuses larger
# ones. Kafka's default message.max.bytes is the same order; a CreateTopic of 10,000
# partitions with three replicas each (KRaft's limit per request) is about 50 KiB.
RAFT_COMMAND_MAX_BYTES: Final = MIB
# The largest message a legitimate peer sends is an AppendEntries batch: pysyncobj fills it
# until the commands in it reach appendEntriesBatchSizeBytes (64 KiB) and includes the entry
# that crossed that line whole, so a batch is under 64 KiB of commands plus one command of
# RAFT_COMMAND_MAX_BYTES; snapshot chunks are logCompactionBatchSize (64 KiB). Measured (see
# tests/unit/test_raft_transport.py): 1.8 MiB for 100-byte random commands before the largest
# one, 1.9 MiB if they were all 1-byte no-ops; 4.1 MiB by largest_message_bytes, which assumes
# zlib compresses nothing. The cap is 8 MiB: four times the measured worst case, and
# check_conf refuses batch sizes whose bound would pass it.
RAFT_MESSAGE_MAX_BYTES: Final = 8 * MIB
# Before the peer proved the secret: its random key, 228 bytes encrypted (the address that
# follows is 268; measured in tests/unit/test_raft_transport.py); 4 KiB is ample and caps what
# a stranger can make the node buffer or decrypt per connection.
HANDSHAKE_MESSAGE_MAX_BYTES: Final = 4096
# A real peer completes the handshake within a round trip and a tick; 5 s allows a loaded host.
HANDSHAKE_TIMEOUT_S: Final = 5.0
# Simultaneous handshakes: one per voter and observer reconnecting at once, with room to spare.
UNPROVEN_CONNECTIONS_MAX: Final = 64
# Bytes one connection reads per poll before the tick thread moves on (one recv is 64 KiB).
READ_PER_POLL_MAX_BYTES: Final = MIB
# Pickle framing of one (command, index, term) entry in an AppendEntries batch (measured: 12-17).
_PICKLE_BYTES_PER_ENTRY: Final = 32
_FERNET_OVERHEAD_BYTES: Final = 73 + 16  # version, timestamp, IV, HMAC; up to a block of padding


def largest_message_bytes(batch_bytes: int, snapshot_chunk_bytes: int) -> int:
    """An upper bound of the largest frame pysyncobj sends with these batch sizes.

    The worst batch is ``batch_bytes - 1`` one-byte commands plus one command of
    :data:`RAFT_COMMAND_MAX_BYTES`; zlib's worst-case growth is 5 bytes per 16 KiB block.
    """
    entries = batch_bytes + 1
    batch = batch_bytes + RAFT_COMMAND_MAX_BYTES + entries * _PICKLE_BYTES_PER_ENTRY
    payload = max(batch, snapshot_chunk_bytes + 1024) + 1024  # + the message's dict
    compressed = payload + payload // 3000 + 64
    return (compressed + _FERNET_OVERHEAD_BYTES) * 4 // 3 + 4


def scan_frames(buffer: bytes | bytearray, limit: int) -> tuple[bool, int | None]:
    """Walk the length prefixes buffered so far.

    Returns (whether a frame is complete, the first declared length outside ``0..limit`` or
    None). Only headers are read, so a frame is judged as soon as its 4-byte header arrives.
    """
    offset = 0
    complete = False
    while offset + FRAME_HEADER.size <= len(buffer):
        (length,) = FRAME_HEADER.unpack_from(buffer, offset)
        if not 0 <= length <= limit:
            return complete, length
        offset += FRAME_HEADER.size + length
        if offset > len(buffer):
            break
        complete = True
    return complete, None


class _RefusalLog:
    """At most one warning per REFUSAL_LOG_INTERVAL_S for each kind of refusal; the next line
    says how many were not logged."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._not_logged: Counter[str] = Counter()

    def warn(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, float("-inf")) < REFUSAL_LOG_INTERVAL_S:
            self._not_logged[kind] += 1
            return
        self._last[kind] = now
        suppressed = self._not_logged.pop(kind, 0)
        more = f" ({suppressed} more since the last report)" if suppressed else ""
        logger.warning(message + "%s", *args, more)


class GuardedConnection(TcpConnection):  # type: ignore[misc]
    """A pysyncobj connection whose reads are bounded (see the module docstring).

    Overrides pysyncobj's private read steps (``_TcpConnection__*``); the rest is pysyncobj's.

    Attributes:
        peer: ``host:port`` of the other end (the configured address for outgoing links).
        proven: A message on this connection decrypted with the secret's key.
        opened_at: When it was accepted or last connected (pysyncobj's monotonic clock).
    """

    _TcpConnection__readBuffer: bytes | bytearray

    def __init__(self, transport: RaftTransport, peer: str, **kwargs: Any) -> None:
        self.peer = peer
        self.proven = False
        self.opened_at = monotonic_time()
        self._raft_transport = transport
        self._raft_read_this_poll = 0
        super().__init__(**kwargs)

    @property
    def frame_limit(self) -> int:
        """The largest frame this connection accepts now."""
        return RAFT_MESSAGE_MAX_BYTES if self.proven else HANDSHAKE_MESSAGE_MAX_BYTES

    def connect(self, host: str, port: int) -> bool:
        self.opened_at = monotonic_time()
        connecting: bool = super().connect(host, port)
        return connecting

    def disconnect(self) -> None:
        self.proven = False  # a reconnect must prove the secret again
        super().disconnect()

    def _TcpConnection__tryReadBuffer(self) -> None:
        self._raft_read_this_poll = 0
        TcpConnection._TcpConnection__tryReadBuffer(self)

    def _TcpConnection__processRead(self) -> bool:
        """One ``recv``; True to read again in this poll."""
        if not isinstance(self._TcpConnection__readBuffer, bytearray):
            # pysyncobj resets it to bytes on (dis)connect; its ``+=`` on bytes copies it all.
            self._TcpConnection__readBuffer = bytearray(self._TcpConnection__readBuffer)
        before = len(self._TcpConnection__readBuffer)
        if not TcpConnection._TcpConnection__processRead(self):
            return False
        buffer = self._TcpConnection__readBuffer
        self._raft_read_this_poll += len(buffer) - before
        limit = self.frame_limit
        complete, refused = scan_frames(buffer, limit)
        if refused is not None:
            self._raft_transport.refuse_frame(self, refused, limit)
            self.disconnect()
            return False
        return not complete and self._raft_read_this_poll < READ_PER_POLL_MAX_BYTES


class _AuthCheck:
    """Wraps pysyncobj's Fernet encryptor for one connection: a message that decrypts proves
    the secret; one that does not is logged (pysyncobj drops the connection silently)."""

    def __init__(self, fernet: Any, conn: GuardedConnection, transport: RaftTransport) -> None:
        self._fernet = fernet
        self._conn = conn
        self._transport = transport

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        token: bytes = self._fernet.encrypt_at_time(data, current_time)
        return token

    def extract_timestamp(self, token: bytes | bytearray) -> int:
        try:
            timestamp: int = self._fernet.extract_timestamp(bytes(token))
        except InvalidToken:
            self._transport.report_rejected(self._conn.peer)
            raise
        return timestamp

    def decrypt(self, token: bytes | bytearray) -> bytes:
        try:
            data: bytes = self._fernet.decrypt(bytes(token))
        except InvalidToken:
            self._transport.report_rejected(self._conn.peer)
            raise
        self._conn.proven = True
        return data


class RaftTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport with guarded connections (see the module docstring).

    Attributes:
        rejected_count: Messages refused because they failed authentication.
        refused_frames: Connections closed for declaring a frame over their limit.
        handshakes_timed_out: Incoming connections closed for not proving the secret in time.
        links_lost: Established links to voters that dropped (not failed connect attempts).

    The counters are plain ints written by the tick thread only (others may read them).
    """

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        self.rejected_count = 0
        self.refused_frames = 0
        self.handshakes_timed_out = 0
        self.links_lost = 0
        self._linked: set[Any] = set()  # voters with an established link
        self._refusals = _RefusalLog()
        self._observer_id: str | None = getattr(syncObj, "_raft_observer_id", None)
        super().__init__(syncObj, selfNode, otherNodes)

    # --- Refusals (tick thread) ---------------------------------------------------------------

    def report_rejected(self, peer: str) -> None:
        """Count (and, rate-limited, log) a message that failed authentication."""
        self.rejected_count += 1
        self._refusals.warn(
            "auth", "raft: refused a message from %s that failed authentication (wrong or "
            "missing raft.secret?); connection closed", peer,
        )  # fmt: skip

    def refuse_frame(self, conn: GuardedConnection, declared: int, limit: int) -> None:
        """Count and log a frame header over ``conn``'s limit (the caller closes it)."""
        self.refused_frames += 1
        if conn.proven:
            self._refusals.warn(
                "frame", "raft: closed the connection with %s: it declared a %d-byte "
                "message, over the %d-byte limit", conn.peer, declared, limit,
            )  # fmt: skip
        else:
            self._refusals.warn(
                "handshake-frame", "raft: closed the connection with %s: it declared a "
                "%d-byte message before proving raft.secret (at most %d bytes until it does)",
                conn.peer, declared, limit,
            )  # fmt: skip

    @property
    def error_count(self) -> int:
        """Connections refused or lost so far (the quorum's ``transport`` errors)."""
        return (self.rejected_count + self.refused_frames + self.handshakes_timed_out
                + self.links_lost)

    # --- Connections --------------------------------------------------------------------------

    def _onNodeConnected(self, node: Any) -> None:
        self._linked.add(node)
        super()._onNodeConnected(node)

    def _onNodeDisconnected(self, node: Any) -> None:
        # pysyncobj also calls this after every failed connect attempt: count only real links.
        if node in self._linked:
            self._linked.discard(node)
            self.links_lost += 1
        super()._onNodeDisconnected(node)

    def addNode(self, node: Any) -> None:
        super().addNode(node)
        plain = self._connections.get(node)
        if plain is None:
            return  # the other side connects to us
        # pysyncobj made a plain TcpConnection for this outgoing link; a guarded one with the
        # same settings and callbacks replaces it before it ever connects.
        conf = self._syncObj.conf
        conn = GuardedConnection(
            self, str(node.id), poller=self._syncObj._poller, timeout=conf.connectionTimeout,
            sendBufferSize=conf.sendBufferSize, recvBufferSize=conf.recvBufferSize,
            keepalive=conf.tcp_keepalive,
        )  # fmt: skip
        if self._syncObj.encryptor is not None:
            conn.encryptor = _AuthCheck(self._syncObj.encryptor, conn, self)
        conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
        self._connections[node] = conn

    def _onNewIncomingConnection(self, plain: Any) -> None:
        # pysyncobj's server accepted the socket into a plain TcpConnection that has read
        # nothing yet; the guarded connection takes the socket over (and its poll slot).
        sock = plain._TcpConnection__socket
        conf = self._syncObj.conf
        conn = GuardedConnection(
            self, _peer_name(sock), poller=self._syncObj._poller, socket=sock,
            timeout=conf.connectionTimeout, sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize,
        )  # fmt: skip
        self._close_oldest_unproven_if_full()
        super()._onNewIncomingConnection(conn)
        if conn.encryptor is not None:
            conn.encryptor = _AuthCheck(conn.encryptor, conn, self)

    def _close_oldest_unproven_if_full(self) -> None:
        unproven = [c for c in self._unknownConnections if not c.proven]
        if len(unproven) < UNPROVEN_CONNECTIONS_MAX:
            return
        oldest = min(unproven, key=lambda c: c.opened_at)
        self._refusals.warn(
            "crowded", "raft: %d connections have not proved raft.secret yet; closed the "
            "oldest, with %s", len(unproven), oldest.peer,
        )  # fmt: skip
        oldest.disconnect()

    def _onTick(self) -> None:
        super()._onTick()
        now = monotonic_time()
        for conn in list(self._unknownConnections):
            if not conn.proven and now - conn.opened_at > HANDSHAKE_TIMEOUT_S:
                self.handshakes_timed_out += 1
                self._refusals.warn(
                    "handshake-timeout", "raft: closed the connection with %s: it did not "
                    "prove raft.secret within %.0f s", conn.peer, HANDSHAKE_TIMEOUT_S,
                )  # fmt: skip
                conn.disconnect()

    def _sendSelfAddress(self, conn: Any) -> None:
        if self._selfIsReadonlyNode and self._observer_id is not None:
            conn.send(OBSERVER_PREFIX + self._observer_id)
        else:
            super()._sendSelfAddress(conn)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        handshake_done = not self._syncObj.encryptor or conn.sendRandKey
        if handshake_done and isinstance(message, str) and message.startswith(OBSERVER_PREFIX):
            # Like pysyncobj's 'readonly' branch, but the node keeps the observer's id.
            node = Node(f"{message}#{self._readonlyNodesCounter}")
            self._readonlyNodesCounter += 1
            self._readonlyNodes.add(node)
            self._unknownConnections.discard(conn)
            self._connections[node] = conn
            conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            self._onReadonlyNodeConnected(node)
            return
        if (
            handshake_done
            and isinstance(message, str)
            and message not in self._nodeAddrToNode
            and message != "readonly"
        ):
            logger.warning(
                "raft: %s announced itself as %r, which is not a voter; connection closed",
                conn.peer, message,
            )  # fmt: skip
        super()._onIncomingMessageReceived(conn, message)


def _peer_name(sock: Any) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
