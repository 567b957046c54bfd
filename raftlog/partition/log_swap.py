"""Compaction swaps: replacing sealed segments with their compacted copy, crash-safely.

The cleaner builds the replacement as ``<files>.cleaned``; ``stage_swap`` renames it to
``.swap`` (the commit point: a ``.log.swap`` means "this replaces the segments it covers"),
then ``install_swap`` unlinks the old segments and renames the ``.swap`` files over the
first one's names. A crash anywhere is finished on the next open: ``finish_swaps`` completes
a committed swap, and ``log_recovery`` deletes the files of one that never committed.
``PartitionLog.replace_segments`` runs the steps and moves the log's memory in between.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from raftlog.partition.errors import PartitionLogError
from raftlog.partition.files import fsync_directory
from raftlog.partition.segment import Segment
from raftlog.partition.segment_files import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SEGMENT_SUFFIXES,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    parse_base_offset,
    segment_file_name,
)

__all__ = [
    "CLEANED_SUFFIX",
    "SWAP_SUFFIX",
    "finish_swaps",
    "install_swap",
    "stage_swap",
    "swap_slot",
]

logger = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
# Tests set this to raise at a named step of the swap, to simulate a crash there.
swap_crash_hook: Callable[[str], None] | None = None


def _swap_step(name: str) -> None:
    if swap_crash_hook is not None:
        swap_crash_hook(name)


def swap_slot(segments: Sequence[Segment], old: Sequence[Segment], cleaned: Segment
              ) -> int | None:
    """The slot of ``old[0]`` in ``segments`` when ``cleaned`` may replace ``old`` there:
    ``old`` is still a run of consecutive sealed segments of the log, not its active one,
    and ``cleaned`` covers exactly their range. None when retention, truncation or another
    swap got there first."""
    first = next((i for i, s in enumerate(segments) if s is old[0]), None)
    if first is None or list(segments[first:first + len(old)]) != list(old) or \
            first + len(old) >= len(segments) or \
            not all(segment.sealed for segment in old) or \
            cleaned.base_offset != old[0].base_offset or \
            cleaned.next_offset != old[-1].next_offset:
        return None
    return first


def stage_swap(directory: Path, cleaned: Segment) -> None:
    """Step 1, up to the commit point: rename ``cleaned``'s index files to ``.swap``, fsync
    the directory; rename its ``.log`` to ``.log.swap``, fsync the directory. Raises OSError
    having deleted the new files: the old segments stand."""
    try:
        _swap_step("rename-indexes-to-swap")
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            path = cleaned.path_for(suffix)
            os.replace(path, path.with_name(path.name.removesuffix(CLEANED_SUFFIX)
                                            + SWAP_SUFFIX))
        fsync_directory(directory)
        _swap_step("rename-log-to-swap")
        os.replace(cleaned.log_path, directory / (
            segment_file_name(cleaned.base_offset, LOG_SUFFIX) + SWAP_SUFFIX))
        fsync_directory(directory)
    except OSError:  # not committed: the old segments stand; drop the new files
        cleaned.close()
        for suffix in SEGMENT_SUFFIXES:
            for extra in (CLEANED_SUFFIX, SWAP_SUFFIX):
                with contextlib.suppress(OSError):
                    (directory / (segment_file_name(cleaned.base_offset, suffix)
                                  + extra)).unlink()
        raise
    cleaned.file_suffix = SWAP_SUFFIX


def install_swap(directory: Path, old: Sequence[Segment], cleaned: Segment) -> None:
    """Steps 2 and 3, after the commit point: unlink the files of ``old[1:]``, rename the
    ``.swap`` index files, then the ``.log.swap``, over ``old[0]``'s files, and fsync the
    directory. On OSError the next open completes the swap (``finish_swaps``)."""
    _swap_step("delete-old-segments")
    for segment in old[1:]:
        segment.delete()
    for segment in old[:1]:
        segment.close()
    _swap_step("rename-swap-over-old")
    _rename_swap_into_place(directory, cleaned.base_offset)
    cleaned.file_suffix = ""
    _swap_step("fsync-directory")
    fsync_directory(directory)


def _rename_swap_into_place(directory: Path, base_offset: int) -> None:
    """Rename the ``.swap`` files of the segment at ``base_offset`` over its final names:
    index files first, the ``.log`` last (an index ``.swap`` missing while the ``.log.swap``
    is there was already renamed: ``stage_swap`` made them all)."""
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX):
        final = directory / segment_file_name(base_offset, suffix)
        swap = final.with_name(final.name + SWAP_SUFFIX)
        if swap.exists():
            os.replace(swap, final)


def _swap_end_offset(path: Path, base_offset: int, index_interval_bytes: int) -> int | None:
    """The offset after the last batch of a ``.log.swap`` file, or None if unreadable."""
    segment = Segment.open_existing(path.parent, base_offset, index_interval_bytes,
                                    file_suffix=SWAP_SUFFIX)
    try:
        end: int | None = base_offset
        for _, header in segment.iter_headers(0):
            end = header.next_offset
        return end
    except PartitionLogError:
        return None
    finally:
        segment.close()


def finish_swaps(directory: Path, index_interval_bytes: int) -> None:
    """Crash recovery of compaction swaps (``replace_segments``), on open: a
    ``<base>.log.swap`` is a complete, fsynced replacement of every segment whose base offset
    lies in ``[base, its end)``; delete those and rename the swap into place. Without a
    ``.log.swap`` the swap never committed: its ``.cleaned`` and index ``.swap`` files are
    deleted by ``log_recovery`` and the old segments stay."""
    swaps = sorted(
        offset for path in directory.glob("*" + LOG_SUFFIX + SWAP_SUFFIX)
        if (offset := parse_base_offset(path, LOG_SUFFIX + SWAP_SUFFIX)) is not None
    )
    for base in swaps:
        swap_path = directory / (segment_file_name(base, LOG_SUFFIX) + SWAP_SUFFIX)
        end = _swap_end_offset(swap_path, base, index_interval_bytes)
        if end is None:  # fsynced before the commit rename, so this is not a crash's doing
            logger.error("%s: unreadable compaction swap file; keeping the old segments",
                         swap_path)
            swap_path.unlink()
            continue
        for path in directory.glob("*" + LOG_SUFFIX):
            covered = parse_base_offset(path, LOG_SUFFIX)
            if covered is not None and base < covered < end:
                for suffix in SEGMENT_SUFFIXES:
                    (directory / segment_file_name(covered, suffix)).unlink(missing_ok=True)
        _rename_swap_into_place(directory, base)
        logger.info("%s: completed an interrupted compaction swap of [%d, %d)", directory,
                    base, end)
    if swaps:
        fsync_directory(directory)
