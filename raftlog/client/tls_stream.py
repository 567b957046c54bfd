"""A TLS stream over a trio socket that decrypts as much as has arrived in one call.

``trio.SSLStream`` returns at most one TLS record (16 KiB) per ``receive_some`` and pays its
locks and retry loop for each, so a 1 MiB produce request costs some 70 awaited calls; on this
machine that held an SSL listener's produce throughput to about a quarter of PLAINTEXT's.
``TlsStream`` keeps the same ``ssl.SSLObject`` over memory BIOs but reads the socket in large
pieces (``SOCKET_READ_BYTES``) and then decrypts every complete record already buffered into
the caller's buffer without awaiting (``recv_into``), so a request costs a few socket reads and
one decryption pass per record.

Concurrency: one task receives while another sends (the Kafka listener's reader and writer).
Both may need to put bytes on the wire (a TLS 1.3 reader answers a KeyUpdate; the handshake
sends session tickets), so every send of the outgoing BIO happens under one lock, which keeps
the bytes in order and lets a ``send_all`` return only once its records are on the socket.
An ``ssl.SSLObject`` call never awaits, so the two tasks never interleave inside OpenSSL.
"""

from __future__ import annotations

import contextlib
import ssl
from typing import Any, Final

import trio

SOCKET_READ_BYTES: Final = 256 * 1024
# Plaintext encrypted per SSLObject.write: the outgoing BIO grows by about this much at a time.
SEND_PIECE_BYTES: Final = 256 * 1024


class TlsStream(trio.abc.Stream):
    """TLS over ``transport_stream`` (a ``trio.SocketStream``), client or server side.

    ``do_handshake`` must complete before ``recv_into``/``receive_some``/``send_all``. Any TLS
    or socket failure after the handshake raises ``trio.BrokenResourceError`` (the stream is
    then unusable); a peer that closes, with or without close_notify, reads as end of stream.
    """

    def __init__(self, transport: trio.SocketStream, context: ssl.SSLContext, *,
                 server_side: bool, server_hostname: str | None = None) -> None:
        self.transport_stream = transport
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                     server_hostname=server_hostname)
        self._send_lock = trio.Lock()
        self._eof = False

    # -- handshake and identity ----------------------------------------------------------------

    async def do_handshake(self) -> None:
        """Completes the TLS handshake (no timeout here: the caller bounds it)."""
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._read_socket():
                    raise trio.BrokenResourceError(
                        "peer closed the connection during the handshake") from None
                continue
            except ssl.SSLError as exc:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._flush()  # the alert tells the peer why
                raise trio.BrokenResourceError(str(exc)) from exc
            await self._flush()
            return

    def getpeercert(self, binary_form: bool = False) -> Any:
        return self._tls.getpeercert(binary_form)

    def version(self) -> str | None:
        return self._tls.version()

    # -- receiving -----------------------------------------------------------------------------

    async def recv_into(self, view: memoryview, nbytes: int) -> int:
        """Up to ``nbytes`` plaintext bytes into ``view``: everything already decryptable, or
        after one socket read when nothing is. 0 at end of stream."""
        nbytes = min(nbytes, len(view))
        while True:
            filled = self._decrypt_into(view, nbytes)
            await self._flush_if_pending()
            if filled or self._eof:
                return filled
            if not await self._read_socket():
                self._eof = True

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        size = SOCKET_READ_BYTES if max_bytes is None else max_bytes
        if size < 1:
            raise ValueError("max_bytes must be >= 1")
        buffer = bytearray(size)
        count = await self.recv_into(memoryview(buffer), size)
        del buffer[count:]
        return buffer

    def _decrypt_into(self, view: memoryview, nbytes: int) -> int:
        """Decrypts buffered records into ``view[:nbytes]`` without awaiting."""
        filled = 0
        while filled < nbytes:
            try:
                # With a buffer, read returns the count (typeshed only knows the bytes form).
                count: int = self._tls.read(  # type: ignore[assignment]
                    nbytes - filled, view[filled:nbytes])
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._eof = True  # close_notify, or a peer that closed without one
                break
            except ssl.SSLError as exc:
                raise trio.BrokenResourceError(f"TLS error: {exc}") from exc
            if count == 0:
                self._eof = True
                break
            filled += count
        return filled

    async def _read_socket(self) -> bool:
        """One socket read into the incoming BIO; False at end of stream."""
        data = await self.transport_stream.receive_some(SOCKET_READ_BYTES)
        if not data:
            self._incoming.write_eof()
            return False
        self._incoming.write(data)
        return True

    # -- sending -------------------------------------------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        async with self._send_lock:
            # Encrypted under the lock, so the outgoing BIO holds a sender's records only
            # while that sender holds the lock (see ``_flush_if_pending``).
            try:
                while view:
                    written = self._tls.write(view[:SEND_PIECE_BYTES])
                    view = view[written:]
            except ssl.SSLError as exc:
                raise trio.BrokenResourceError(f"TLS error: {exc}") from exc
            await self._send_pending()

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def _flush_if_pending(self) -> None:
        """Sends what a read produced (a TLS 1.3 KeyUpdate answer), unless a sender holds the
        lock: its ``_send_pending`` loop sends these bytes too. A receiver never waits for a
        sender: two peers whose receivers waited on senders blocked by full socket buffers
        would wait for each other forever."""
        if not self._outgoing.pending:
            return
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            return
        try:
            await self._send_pending()
        finally:
            self._send_lock.release()

    async def _flush(self) -> None:
        """Sends everything the TLS object has produced (handshake and closing)."""
        async with self._send_lock:
            await self._send_pending()

    async def _send_pending(self) -> None:
        """With the send lock held: sends the outgoing BIO until it is empty, including bytes a
        receiver added while this task was sending."""
        assert self._send_lock.locked()
        while self._outgoing.pending:
            await self.transport_stream.send_all(self._outgoing.read())

    # -- closing -------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Sends close_notify (best effort, 1 s) and closes the socket."""
        try:
            with trio.move_on_after(1):
                with contextlib.suppress(ssl.SSLError):
                    self._tls.unwrap()
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                                         trio.BusyResourceError, OSError):
                    await self._flush()
        finally:
            await self.transport_stream.aclose()
