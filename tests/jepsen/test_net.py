"""Network namespaces, the switch bridge and nftables partitions, on their own (root only):
the harness in the root namespace reaches every node, a grudge cuts exactly the pairs it
names, healing restores them, and teardown leaves nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from jepsen.net import LoopbackNet, NamespaceNet, choose_net

PORT = 7011
SERVER = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
          "socket.SO_REUSEADDR,1)\ns.bind((sys.argv[1],int(sys.argv[2])));s.listen(16)\n"
          "while True:\n c,_=s.accept();c.sendall(b'hi');c.close()\n")


@pytest.fixture
def net() -> Iterator[NamespaceNet]:
    chosen = choose_net()
    if isinstance(chosen, LoopbackNet):
        pytest.skip(f"no network namespaces here: {chosen.reason}")
    assert isinstance(chosen, NamespaceNet)
    chosen.setup([1, 2, 3])
    try:
        yield chosen
    finally:
        chosen.teardown()


def _reach_from_root(host: str) -> bool:
    try:
        with socket.create_connection((host, PORT), timeout=1.0) as s:
            return s.recv(2) == b"hi"
    except OSError:
        return False


def _reach_from(net: NamespaceNet, node: int, host: str) -> bool:
    probe = (f"import socket\ntry:\n s=socket.create_connection(('{host}',{PORT}),timeout=1.0)"
             "\n print(s.recv(2).decode())\nexcept OSError:\n print('no')")
    out = subprocess.run([*net.exec_prefix(node), sys.executable, "-c", probe],
                         capture_output=True, text=True, timeout=20).stdout
    return out.strip() == "hi"


def test_partitions_cut_exactly_the_grudge(net: NamespaceNet) -> None:
    servers = [subprocess.Popen([*net.exec_prefix(n), sys.executable, "-c", SERVER,
                                 net.host(n), str(PORT)]) for n in (1, 2, 3)]
    try:
        deadline = time.monotonic() + 20
        while not all(_reach_from_root(net.host(n)) for n in (1, 2, 3)):
            assert time.monotonic() < deadline, "servers in the namespaces unreachable"
            time.sleep(0.1)
        assert _reach_from(net, 2, net.host(1))
        net.partition({1: frozenset({2}), 2: frozenset({1})})
        assert not _reach_from(net, 2, net.host(1))
        assert not _reach_from(net, 1, net.host(2))
        assert _reach_from(net, 3, net.host(1))
        assert _reach_from_root(net.host(1)) and _reach_from_root(net.host(2))
        net.heal()
        assert _reach_from(net, 2, net.host(1))
    finally:
        for s in servers:
            s.kill()
            s.wait()
    prefix = net.prefix
    net.teardown()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in listed
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert net.root_leg not in links
    assert os.path.exists("/proc")  # the host is untouched otherwise
