"""The harness's network: one network namespace per node, a switch namespace, partitions.

Topology (namespace mode)::

    root namespace (the harness and its clients)
      jh<tag>  10.213.S.254/24 ──veth──┐
                                       │   <prefix>-sw  (switch namespace)
                                       ├── br0 (bridge, no address)
    <prefix>-n1  eth0 10.213.S.1/24 ───┤   ports: host, n1, n2, ...
    <prefix>-n2  eth0 10.213.S.2/24 ───┤
    ...                                ┘

Every node runs inside its own namespace (``ip netns exec``) and listens and advertises on its
own address, so clients in the root namespace reach every node directly over the root leg and
no node can bypass a partition by an unbound socket. The bridge lives in a separate switch
namespace so the host's br_netfilter and FORWARD policy never see the traffic, and the host's
netfilter is never touched. ``S`` is picked per run (under a lock file) among subnets no
interface on the host uses, and names carry the harness's pid and a random tag, so concurrent
runs do not collide; dead runs' namespaces are swept at start-up.

A partition is a *grudge* ``{node: {nodes it drops packets from}}`` (Jepsen's
``jepsen.nemesis/complete-grudge``), applied as one nftables table per node namespace
(``table inet jepsen``, loaded atomically with ``nft -f -``) that drops input from the
grudged peers' addresses. Healing deletes the tables. The harness's own address is never
dropped: clients stay connected to every node, as with Jepsen's control node.

Where namespaces cannot be created (not root, no ``ip``, ``ip netns add`` fails) the harness
uses :class:`LoopbackNet`: nodes on 127.0.0.1 with free ports and process faults only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

SUBNET_PREFIX: Final = "10.213"
CLIENT_HOST_OCTET: Final = 254
NAME_PREFIX: Final = "jp"
LOCK_PATH: Final = Path("/tmp/raftlog-jepsen-net.lock")
COMMAND_TIMEOUT_S: Final = 20.0
_NS_RE: Final = re.compile(rf"^{NAME_PREFIX}(\d+)x[0-9a-f]+-(sw|n\d+)$")

Grudge = Mapping[int, frozenset[int]]


class NetError(RuntimeError):
    """A network set-up step failed."""


def _run(args: Sequence[str], stdin: str | None = None, check: bool = True) -> str:
    # Own process group: a Ctrl-C at the terminal must not kill an ``ip``/``nft`` command
    # half-way (a half-built network, or a partition that never heals, in a run that goes on).
    proc = subprocess.run(list(args), input=stdin, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, check=False, process_group=0)
    if check and proc.returncode != 0:
        raise NetError(f"{' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


class Net(Protocol):
    """What the database and the nemesis need from the network."""

    namespaces: bool
    description: str

    def setup(self, nodes: Sequence[int]) -> None: ...
    def host(self, node: int) -> str: ...
    def exec_prefix(self, node: int) -> list[str]: ...
    def partition(self, grudge: Grudge) -> None: ...
    def heal(self) -> None: ...
    def teardown(self) -> None: ...


@dataclass
class LoopbackNet:
    """Fallback: every node on 127.0.0.1 (distinct ports); no network faults."""

    reason: str = ""
    namespaces: bool = False
    description: str = "loopback (process faults only)"

    def setup(self, nodes: Sequence[int]) -> None:
        return None

    def host(self, node: int) -> str:
        return "127.0.0.1"

    def exec_prefix(self, node: int) -> list[str]:
        return []

    def partition(self, grudge: Grudge) -> None:
        raise NetError("network partitions need network namespaces: " + self.reason)

    def heal(self) -> None:
        return None

    def teardown(self) -> None:
        return None


@dataclass
class NamespaceNet:
    """Namespaces, veth pairs and a bridge in a switch namespace (see the module docstring)."""

    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    namespaces: bool = True
    description: str = "network namespaces + bridge, nftables partitions"
    subnet: int | None = None
    nodes: list[int] = field(default_factory=list)
    _created: list[str] = field(default_factory=list)
    _partitioned: set[int] = field(default_factory=set)

    @property
    def prefix(self) -> str:
        return f"{NAME_PREFIX}{os.getpid()}x{self.tag}"

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def root_leg(self) -> str:
        return f"jh{self.tag}"  # <= 15 characters, unique per run

    def node_ns(self, node: int) -> str:
        return f"{self.prefix}-n{node}"

    def host(self, node: int) -> str:
        assert self.subnet is not None
        return f"{SUBNET_PREFIX}.{self.subnet}.{node}"

    @property
    def client_host(self) -> str:
        assert self.subnet is not None
        return f"{SUBNET_PREFIX}.{self.subnet}.{CLIENT_HOST_OCTET}"

    def exec_prefix(self, node: int) -> list[str]:
        return ["ip", "netns", "exec", self.node_ns(node)]

    def setup(self, nodes: Sequence[int]) -> None:
        self.nodes = list(nodes)
        sweep_stale()
        with _lock():
            self.subnet = _free_subnet()
            try:
                self._build()
            except BaseException:
                self.teardown()
                raise

    def _build(self) -> None:
        sw = self.switch_ns
        _run(["ip", "netns", "add", sw])
        self._created.append(sw)
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        for node in self.nodes:
            ns = self.node_ns(node)
            _run(["ip", "netns", "add", ns])
            self._created.append(ns)
            _run(["ip", "-n", sw, "link", "add", f"n{node}", "type", "veth", "peer", "name",
                  "eth0", "netns", ns])
            _run(["ip", "-n", sw, "link", "set", f"n{node}", "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.host(node)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "link", "add", self.root_leg, "type", "veth", "peer", "name", "host",
              "netns", sw])
        _run(["ip", "-n", sw, "link", "set", "host", "master", "br0", "up"])
        _run(["ip", "addr", "add", f"{self.client_host}/24", "dev", self.root_leg])
        _run(["ip", "link", "set", self.root_leg, "up"])

    def partition(self, grudge: Grudge) -> None:
        """Apply ``grudge`` (replacing any previous partition)."""
        self.heal()
        for node, drops in sorted(grudge.items()):
            if not drops:
                continue
            addresses = ", ".join(self.host(d) for d in sorted(drops))
            rules = ("table inet jepsen {\n chain input {\n"
                     "  type filter hook input priority 0; policy accept;\n"
                     f"  ip saddr {{ {addresses} }} drop\n }}\n}}\n")
            _run([*self.exec_prefix(node), "nft", "-f", "-"], stdin=rules)
            self._partitioned.add(node)

    def heal(self) -> None:
        for node in sorted(self._partitioned):
            # Declaring the table first makes the delete succeed whether or not it exists.
            _run([*self.exec_prefix(node), "nft", "-f", "-"],
                 stdin="table inet jepsen\ndelete table inet jepsen\n", check=False)
        self._partitioned.clear()

    def teardown(self) -> None:
        """Delete the namespaces (their processes must be stopped first) and the root leg."""
        for ns in reversed(self._created):
            _kill_namespace_processes(ns)
        _run(["ip", "link", "del", self.root_leg], check=False)
        for ns in reversed(self._created):
            _run(["ip", "netns", "del", ns], check=False)
        self._created.clear()
        self._partitioned.clear()


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    with LOCK_PATH.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _free_subnet() -> int:
    used = _run(["ip", "-4", "-o", "addr", "show"]) + _run(["ip", "-4", "route", "show"])
    taken = {int(m) for m in re.findall(rf"{re.escape(SUBNET_PREFIX)}\.(\d+)\.", used)}
    for candidate in [secrets.randbelow(250) + 1 for _ in range(20)] + list(range(1, 251)):
        if candidate not in taken:
            return candidate
    raise NetError(f"no free {SUBNET_PREFIX}.x.0/24 subnet")


def _kill_namespace_processes(ns: str) -> None:
    pids = _run(["ip", "netns", "pids", ns], check=False).split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid), 9)


def sweep_stale() -> list[str]:
    """Delete namespaces left by harness runs whose process is gone; returns their names."""
    swept: list[str] = []
    for line in _run(["ip", "netns", "list"], check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NS_RE.match(name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        _kill_namespace_processes(name)
        _run(["ip", "netns", "del", name], check=False)
        swept.append(name)
    return swept


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ensure_nft() -> str | None:
    """Make sure ``nft`` exists (installing Debian's ``nftables`` as root if needed);
    returns why partitions are impossible, or None."""
    if shutil.which("nft"):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "nft is not installed (apt-get install nftables)"
    print("jepsen: nft not found; installing Debian's nftables package (apt-get)...",
          file=__import__("sys").stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "nftables"]):
        try:
            subprocess.run(args, env=env, capture_output=True, timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"installing nftables failed: {exc}"
    return None if shutil.which("nft") else "installing nftables failed"


def choose_net(want_namespaces: bool = True) -> Net:
    """A :class:`NamespaceNet` when this machine can make namespaces, else loopback."""
    if not want_namespaces:
        return LoopbackNet(reason="namespaces disabled (--no-netns)")
    if os.geteuid() != 0:
        return LoopbackNet(reason="not root")
    if shutil.which("ip") is None:
        return LoopbackNet(reason="iproute2 (ip) is not installed")
    probe = f"{NAME_PREFIX}{os.getpid()}x{secrets.token_hex(3)}-n0"
    try:
        _run(["ip", "netns", "add", probe])
    except (NetError, OSError, subprocess.TimeoutExpired) as exc:
        return LoopbackNet(reason=f"ip netns add failed: {exc}")
    _run(["ip", "netns", "del", probe], check=False)
    problem = ensure_nft()
    if problem is not None:
        return LoopbackNet(reason=problem)
    return NamespaceNet()
