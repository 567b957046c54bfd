"""The sizes the Raft port's limits rest on, measured with pysyncobj's own encoding.

Goal: the handshake limit is above every message a peer sends before it has proved the
secret, the message cap is above the largest message a legitimate peer can send (with
margin), ``check_conf`` refuses batch sizes that would break that, and the frame scanner
judges a frame from its header alone.
Method: messages built the way pysyncobj 0.3.17 sends them (pickle, zlib level 3, Fernet keyed
by the secret, the random-key wrapper after the handshake); sizes printed with ``-s``.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.encryptor import getEncryptor

from raftlog.quorum.raft_settings import (
    RaftSettings,
    UnsafeRaftConfigError,
    build_conf,
    check_conf,
)
from raftlog.quorum.raft_storage import JOURNAL_FILE_NAME, SNAPSHOT_FILE_NAME
from raftlog.quorum.raft_transport import (
    HANDSHAKE_MESSAGE_MAX_BYTES,
    RAFT_COMMAND_MAX_BYTES,
    RAFT_MESSAGE_MAX_BYTES,
    largest_message_bytes,
    scan_frames,
)

BATCH_BYTES = 2**16  # pysyncobj's appendEntriesBatchSizeBytes and logCompactionBatchSize
FERNET = getEncryptor("raft-transport-test-secret")


def encrypted_size(message: Any, rand_key: bytes | None) -> int:
    """The frame body pysyncobj's TcpConnection.send produces for ``message``."""
    if rand_key is not None:
        message = (rand_key, message)
    data = zlib.compress(pysyncobj_pickle.dumps(message), 3)
    return len(FERNET.encrypt_at_time(data, int(time.monotonic())))


def append_entries(entries: list[tuple[bytes, int, int]]) -> dict[str, Any]:
    return {
        "type": "append_entries", "term": 2**31, "commit_index": 2**40, "entries": entries,
        "prevLogIdx": 2**40, "prevLogTerm": 2**31,
    }  # fmt: skip


def test_handshake_messages_fit_the_limit_before_proof() -> None:
    key = os.urandom(32)
    sizes = {
        "random key (first message)": encrypted_size(os.urandom(32), None),
        "voter address": encrypted_size("[2001:db8::1234:5678]:65535", key),
        "observer id": encrypted_size("readonly:2147483647", key),
        "admin status command": encrypted_size(["status"], key),
    }
    print(sizes)
    assert max(sizes.values()) * 8 <= HANDSHAKE_MESSAGE_MAX_BYTES, sizes


def test_largest_legitimate_message_is_well_under_the_cap() -> None:
    key = os.urandom(32)
    largest = b"\x00" + os.urandom(RAFT_COMMAND_MAX_BYTES - 1)
    # pysyncobj adds entries until their commands reach the batch size, the one crossing it
    # included: the most entries are 1-byte no-ops, the most realistic ones ~100 bytes.
    no_ops = [(b"\x01", 2**40 + i, 2**31) for i in range(BATCH_BYTES - 1)]
    commands = [(b"\x00" + os.urandom(99), 2**40 + i, 2**31) for i in range(BATCH_BYTES // 100)]
    chunk = {
        "type": "append_entries", "term": 2**31, "commit_index": 2**40,
        "serialized": (os.urandom(BATCH_BYTES), False, False),
    }  # fmt: skip
    sizes = {
        "no-ops + largest command": encrypted_size(
            append_entries([*no_ops, (largest, 2**41, 2**31)]), key
        ),
        "commands + largest command": encrypted_size(
            append_entries([*commands, (largest, 2**41, 2**31)]), key
        ),
        "snapshot chunk": encrypted_size(chunk, key),
    }
    bound = largest_message_bytes(BATCH_BYTES, BATCH_BYTES)
    print({name: f"{size / 2**20:.2f} MiB" for name, size in sizes.items()},
          f"bound {bound / 2**20:.2f} MiB")  # fmt: skip
    assert max(sizes.values()) <= bound <= RAFT_MESSAGE_MAX_BYTES
    assert max(sizes.values()) * 4 <= RAFT_MESSAGE_MAX_BYTES


def test_check_conf_refuses_batches_the_peers_would_refuse(tmp_path: Path) -> None:
    conf = build_conf(
        RaftSettings(),
        journal_file=tmp_path / JOURNAL_FILE_NAME,
        snapshot_file=tmp_path / SNAPSHOT_FILE_NAME,
        password="secret",
        bind_address=None,
    )
    conf.appendEntriesBatchSizeBytes = RAFT_MESSAGE_MAX_BYTES
    with pytest.raises(UnsafeRaftConfigError, match="cap on Raft messages"):
        check_conf(conf)


def header(length: int) -> bytes:
    return struct.pack("i", length)


@pytest.mark.parametrize(
    ("buffer", "expected"),
    [
        (b"", (False, None)),
        (b"\x05\x00", (False, None)),  # header incomplete
        (header(5) + b"abc", (False, None)),
        (header(5) + b"abcde", (True, None)),
        (header(0), (True, None)),
        (header(4096), (False, None)),  # at the limit: allowed
        (header(4097), (False, 4097)),  # judged by the header, before any body
        (header(2**31 - 1), (False, 2**31 - 1)),
        (header(-1), (False, -1)),
        (header(2) + b"ab" + header(2**31 - 1), (True, 2**31 - 1)),  # every header counts
        (header(2) + b"ab" + header(3) + b"a", (True, None)),
    ],
)
def test_scan_frames(buffer: bytes, expected: tuple[bool, int | None]) -> None:
    assert scan_frames(buffer, 4096) == expected
    assert scan_frames(bytearray(buffer), 4096) == expected
