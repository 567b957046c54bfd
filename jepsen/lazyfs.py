"""LazyFS mounts for the power-loss nemesis (:mod:`jepsen.faults_power`).

`LazyFS <https://github.com/dsrhaslab/lazyfs>`_ is a FUSE file system with its own page cache
that writes data to the file system below it only when the application fsyncs. Writing
``lazyfs::clear-cache`` to its control FIFO drops every write not yet fsynced, which is what a
power cut does to a real page cache. ``make lazyfs`` (``jepsen/setup_lazyfs.sh``) builds it
from its source into ``.cache/lazyfs/`` where ``/dev/fuse`` is usable; ``RAFTLOG_LAZYFS``
names another binary.

Each node's data directory (``node-<i>/data``, its ``log.dirs``) becomes a LazyFS mount over
``node-<i>/data.lazyfs-root``. Each mount has its own LazyFS process (run in the foreground,
so the harness owns its pid), config file, control FIFO, completion FIFO and log, all under
the run's ``lazyfs/`` directory (kept with the run's other files).

The pure parts (:func:`config_text`, :func:`mount_command`, :func:`parse_mountinfo`,
:func:`stale_mounts`) are unit-tested; :class:`LazyFsMount` and :class:`LazyFsSet` are the
I/O shell.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from jepsen.net import pid_alive

ENV_BINARY: Final = "RAFTLOG_LAZYFS"
#: Where ``make lazyfs`` puts the build (``jepsen/setup_lazyfs.sh``).
DEFAULT_PREFIX: Final = Path(__file__).resolve().parent.parent / ".cache" / "lazyfs"
BINARY_IN_PREFIX: Final = Path("src/lazyfs/build/lazyfs")
CLEAR_CACHE: Final = "lazyfs::clear-cache"
CLEAR_CACHE_DONE: Final = "finished::clear-cache"
#: ``-o fsname=`` of every harness mount: ``jepsen-lazyfs-<harness pid>``, so a later run can
#: find the mounts of a harness that died (:func:`stale_mounts`).
FSNAME_PREFIX: Final = "jepsen-lazyfs-"
CACHE_SIZE: Final = "512mb"
MOUNT_TIMEOUT_S: Final = 15.0
CLEAR_TIMEOUT_S: Final = 15.0
STOP_TIMEOUT_S: Final = 10.0


class LazyFsError(RuntimeError):
    pass


# -- pure ---------------------------------------------------------------------------------


def find_binary(env: Mapping[str, str], prefix: Path = DEFAULT_PREFIX) -> Path | None:
    """``$RAFTLOG_LAZYFS`` if set, else the ``make lazyfs`` build, if it exists."""
    named = env.get(ENV_BINARY)
    candidate = Path(named) if named else prefix / BINARY_IN_PREFIX
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


def config_text(fifo: Path, fifo_completed: Path, logfile: Path,
                cache_size: str = CACHE_SIZE) -> str:
    """LazyFS's TOML config (its ``config/default.toml`` with our paths): the ``simple``
    cache without eviction, so nothing reaches the disk below except through fsync."""
    return (
        "[faults]\n"
        f'fifo_path="{fifo}"\n'
        f'fifo_path_completed="{fifo_completed}"\n'
        "[cache]\n"
        "apply_eviction=false\n"
        "[cache.simple]\n"
        f'custom_size="{cache_size}"\n'
        "blocks_per_page=1\n"
        "[filesystem]\n"
        "log_all_operations=false\n"
        f'logfile="{logfile}"\n'
    )


def mount_command(binary: Path, mountpoint: Path, root: Path, config_name: str,
                  fsname: str) -> list[str]:
    """What ``lazyfs/scripts/mount-lazyfs.sh -f`` runs, plus a recognisable ``fsname``.

    Two quirks of LazyFS's ``main``: a ``--config-path`` whose text contains ``-o`` anywhere
    (``/tmp/pytest-of-root/...``) is taken for a missing one, so the config is named relative
    to the process's working directory; and it keeps at most 10 arguments, so the FUSE
    options go in one ``-o``."""
    options = f"allow_other,modules=subdir,subdir={root},fsname={fsname}"
    return [str(binary), str(mountpoint), "--config-path", config_name, "-o", options, "-f"]


def unmount_commands(mountpoint: Path) -> list[list[str]]:
    """A normal unmount, then a lazy one (detach now, clean up when no longer busy)."""
    return [["fusermount3", "-u", str(mountpoint)], ["fusermount3", "-uz", str(mountpoint)]]


def _unescape(field_text: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field_text):
        if field_text[i] == "\\" and field_text[i + 1:i + 4].isdigit():
            out.append(chr(int(field_text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field_text[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class MountEntry:
    mountpoint: str
    fstype: str
    source: str


def parse_mountinfo(text: str) -> list[MountEntry]:
    """The mount point, file system type and source of each ``/proc/self/mountinfo`` line."""
    entries = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        entries.append(MountEntry(_unescape(fields[4]), tail[0], _unescape(tail[1])))
    return entries


def stale_mounts(entries: Iterable[MountEntry], alive: Callable[[int], bool]) -> list[str]:
    """Mount points of harness LazyFS mounts whose harness process is gone."""
    stale = []
    for e in entries:
        if not e.source.startswith(FSNAME_PREFIX):
            continue
        pid_text = e.source[len(FSNAME_PREFIX):]
        if pid_text.isdigit() and not alive(int(pid_text)):
            stale.append(e.mountpoint)
    return stale


# -- I/O ----------------------------------------------------------------------------------


def fuse_unusable_reason() -> str | None:
    """None when ``/dev/fuse`` can be opened and ``fusermount3`` exists, else why not."""
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError as exc:
        return f"/dev/fuse is not usable: {exc}"
    os.close(fd)
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (Debian package fuse3)"
    return None


def _mountinfo() -> list[MountEntry]:
    return parse_mountinfo(Path("/proc/self/mountinfo").read_text(encoding="utf-8"))


def is_mounted(path: Path) -> bool:
    target = str(path.resolve())
    return any(e.mountpoint == target for e in _mountinfo())


def unmount(path: Path) -> bool:
    """Unmount (lazily if busy); True when it is no longer mounted."""
    for command in unmount_commands(path):
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False, timeout=STOP_TIMEOUT_S)
        if not is_mounted(path):
            return True
    return False


def sweep_stale_mounts() -> list[str]:
    """Lazily unmount the LazyFS mounts of harness processes that died (their LazyFS
    processes exit once unmounted)."""
    swept = stale_mounts(_mountinfo(), pid_alive)
    for mountpoint in swept:
        unmount(Path(mountpoint))
    return swept


@dataclass
class LazyFsMount:
    """One LazyFS process: ``mountpoint`` shows ``root`` with a lazy page cache."""

    binary: Path
    mountpoint: Path
    root: Path
    work: Path  # config, FIFOs and log
    process: subprocess.Popen[bytes] | None = None
    _done_fd: int | None = None
    clears: int = 0

    @property
    def fifo(self) -> Path:
        return self.work / "faults.fifo"

    @property
    def fifo_completed(self) -> Path:
        return self.work / "faults-completed.fifo"

    @property
    def log(self) -> Path:
        return self.work / "lazyfs.log"

    def start(self) -> None:
        """Mount; what was already in the mount point moves to the root first."""
        self.work.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        for entry in list(self.mountpoint.iterdir()):
            entry.rename(self.root / entry.name)
        for fifo in (self.fifo, self.fifo_completed):
            with contextlib.suppress(FileExistsError):
                os.mkfifo(fifo, 0o600)
        # LazyFS opens the completion FIFO for writing at start-up, which blocks until a
        # reader exists: open ours first (non-blocking, so it never blocks us either).
        self._done_fd = os.open(self.fifo_completed, os.O_RDONLY | os.O_NONBLOCK)
        config = self.work / "lazyfs.toml"
        config.write_text(config_text(self.fifo, self.fifo_completed, self.log),
                          encoding="utf-8")
        command = mount_command(self.binary, self.mountpoint, self.root, config.name,
                                f"{FSNAME_PREFIX}{os.getpid()}")
        with (self.work / "lazyfs.out").open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.work,
                                            start_new_session=True)
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not is_mounted(self.mountpoint):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise LazyFsError(f"LazyFS did not mount {self.mountpoint}; see "
                                  f"{self.work / 'lazyfs.out'}")
            time.sleep(0.05)

    def clear_cache(self) -> None:
        """Drop every write not yet fsynced; returns once LazyFS says it is done."""
        if self.process is None or self.process.poll() is not None or self._done_fd is None:
            raise LazyFsError(f"LazyFS for {self.mountpoint} is not running")
        with contextlib.suppress(BlockingIOError):
            while os.read(self._done_fd, 4096):  # stale notifications
                pass
        fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, f"{CLEAR_CACHE}\n".encode())
        finally:
            os.close(fd)
        deadline = time.monotonic() + CLEAR_TIMEOUT_S
        received = b""
        while CLEAR_CACHE_DONE.encode() not in received:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LazyFsError(f"LazyFS for {self.mountpoint} did not confirm "
                                  f"{CLEAR_CACHE} within {CLEAR_TIMEOUT_S:.0f} s")
            ready, _, _ = select.select([self._done_fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self._done_fd, 4096)
                except BlockingIOError:
                    continue
                if not chunk:  # no writer (yet): poll
                    time.sleep(0.01)
                received += chunk
        self.clears += 1

    def stop(self) -> None:
        """Unmount (lazily if busy) and end the LazyFS process; safe to call twice."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if is_mounted(self.mountpoint):
                unmount(self.mountpoint)
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    self.process.send_signal(signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_S)
        if self._done_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._done_fd)
            self._done_fd = None


@dataclass
class LazyFsSet:
    """The LazyFS mounts of one cluster, by node id."""

    mounts: dict[int, LazyFsMount] = field(default_factory=dict)

    @classmethod
    def mount(cls, binary: Path, data_dirs: Mapping[int, Path], work: Path) -> LazyFsSet:
        """Mount every node's data directory; on any failure unmount those already done."""
        result = cls()
        try:
            for node_id, data in sorted(data_dirs.items()):
                m = LazyFsMount(binary, data, data.with_name(data.name + ".lazyfs-root"),
                                work / f"n{node_id}")
                result.mounts[node_id] = m
                m.start()
        except BaseException:
            result.unmount_all()
            raise
        return result

    def clear_cache(self, node_id: int) -> None:
        self.mounts[node_id].clear_cache()

    def unmount_all(self) -> list[str]:
        """Unmount every mount; returns the problems (never raises)."""
        problems = []
        for node_id, m in self.mounts.items():
            try:
                m.stop()
            except Exception as exc:  # teardown goes on for the others
                problems.append(f"n{node_id}: {type(exc).__name__}: {exc}")
            if m.mountpoint.exists() and is_mounted(m.mountpoint):
                problems.append(f"n{node_id}: {m.mountpoint} is still mounted")
        return problems


def check_available(env: Mapping[str, str]) -> tuple[Path | None, str | None]:
    """(binary, None) when power-loss faults can run here, else (None, why not)."""
    reason = fuse_unusable_reason()
    if reason is not None:
        return None, reason
    binary = find_binary(env)
    if binary is None:
        return None, ("no LazyFS binary: run `make lazyfs` (builds it from source into "
                      f"{DEFAULT_PREFIX}) or set {ENV_BINARY}")
    if os.geteuid() != 0:
        return None, "LazyFS mounts need root here (allow_other, fusermount3)"
    return binary, None


def data_dirs(node_dirs: Mapping[int, Path]) -> dict[int, Path]:
    """node id -> the data directory that ``log.dirs`` names (``node-<i>/data``)."""
    return {i: d / "data" for i, d in node_dirs.items()}
