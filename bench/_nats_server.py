"""Where the nats-server binary is and which version it is: the peer the benchmarks compare
against. Standard library only, so both the shared helpers (``_support``: prerequisites, the
environment of a run) and the NATS side (``_nats_side``) can use it without importing each
other.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# Debian's package installs it here, outside a non-root user's PATH.
_DEBIAN_PATH = "/usr/sbin/nats-server"


def nats_server_path() -> str | None:
    """The nats-server binary, or None when it is not installed."""
    path = shutil.which("nats-server") or _DEBIAN_PATH
    return path if Path(path).exists() else None


def nats_server_binary() -> str:
    """The nats-server binary; raises when it is not installed."""
    path = nats_server_path()
    if path is None:
        raise RuntimeError("nats-server is not installed: apt-get install -y nats-server")
    return path


def nats_server_version() -> str:
    """``nats-server --version`` as it prints it."""
    out = subprocess.run([nats_server_binary(), "--version"], capture_output=True, text=True,
                         check=False)
    return (out.stdout or out.stderr).strip()
