"""Several "hosts" on one machine: Linux network namespaces joined by a bridge, for network tests.

``make_network(["boot", "a", "b"])`` creates one namespace per host plus a switch namespace holding a
bridge; each host gets a veth pair to the bridge and an address the helper assigns (10.77.<net>.<n>/24).
Nothing is created in the machine's own namespace, so a test can neither clash with the host's routes
nor leave interfaces on it: deleting the namespaces deletes every link. Cleanup runs on exit from the
``with`` block, failed test or not.

What chaos tests need is on ``Host``: ``popen`` (a process inside the namespace; its PID is the real
child, so it can be signalled by PID), ``link_down`` / ``link_up`` (pull the cable), and
``drop_inbound_tcp`` / ``allow_inbound_tcp`` (an nftables table that drops new inbound TCP connections,
as a NAT or a firewall does, while the host's own outbound connections keep working).

Needs root, ``ip`` (iproute2) and, for the nft rules, ``nft`` (Debian: ``apt-get install nftables``).
``unavailable_reason()`` says why a test should skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

HOST_IFACE = "eth0"  # inside each host namespace
BRIDGE = "br0"  # inside the switch namespace
NFT_TABLE = "swarmnode_test_guard"
_CMD_TIMEOUT_S = 10


def unavailable_reason(*, nft: bool = False) -> str | None:
    """Why network namespaces (and nft rules, if asked) cannot be used here; None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if nft and shutil.which("nft") is None:
        return "the `nft` command is not installed (Debian: apt-get install nftables)"
    return None


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Host:
    """One namespace with one interface (``eth0``) on the bridge."""

    name: str
    netns: str
    ip: str

    def exec_args(self, *cmd: str) -> list[str]:
        """``cmd`` wrapped to run in this namespace (``ip netns exec`` execs it: same PID)."""
        return ["ip", "netns", "exec", self.netns, *cmd]

    def popen(self, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``cmd`` inside this namespace; keyword arguments go to ``subprocess.Popen``."""
        return subprocess.Popen(self.exec_args(*cmd), **kwargs)

    def run(self, *cmd: str) -> str:
        """Run a short command inside this namespace; its stdout (raises on a non-zero exit)."""
        return _run(*self.exec_args(*cmd))

    def link_down(self) -> None:
        self.run("ip", "link", "set", HOST_IFACE, "down")

    def link_up(self) -> None:
        self.run("ip", "link", "set", HOST_IFACE, "up")

    def drop_inbound_tcp(self) -> None:
        """Drop new TCP connections coming in on ``eth0``; replies to our own outbound ones still pass.

        A bare SYN (no ACK) is what opens a connection; dropping only those leaves established
        connections in both directions alone, like a NAT or a stateful firewall.
        """
        rules = (
            f"table inet {NFT_TABLE} {{\n"
            "  chain input {\n"
            "    type filter hook input priority 0; policy accept;\n"
            f'    iifname "{HOST_IFACE}" tcp flags & (syn | ack) == syn counter drop\n'
            "  }\n"
            "}\n"
        )
        subprocess.run(
            self.exec_args("nft", "-f", "-"), input=rules, text=True, check=True,
            capture_output=True, timeout=_CMD_TIMEOUT_S,
        )  # fmt: skip

    def tcp_peer_ips(self) -> set[str]:
        """Remote IPv4 addresses of this host's established TCP connections (``ss``): who it talks to."""
        out = self.run("ss", "-4tnH", "state", "established")
        return {line.split()[-1].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}

    def allow_inbound_tcp(self) -> None:
        self.run("nft", "delete", "table", "inet", NFT_TABLE)

    def dropped_syns(self) -> int:
        """Packets the drop rule has dropped so far (proof that something really tried to get in)."""
        out = self.run("nft", "list", "table", "inet", NFT_TABLE)
        for line in out.splitlines():
            if "counter packets" in line:
                return int(line.split("counter packets", 1)[1].split()[0])
        return 0


@dataclass
class Network:
    hosts: dict[str, Host]
    switch: str

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]


@contextlib.contextmanager
def make_network(names: Sequence[str], *, net: int = 77, public: bool = False) -> Iterator[Network]:
    """Namespaces ``names`` on one bridge, addresses 10.<net>.0.1, .2, ... in order; removed on exit.

    ``public`` numbers them 11.<net>.0.x instead: libp2p builds a node's relayed addresses only from its
    relay's *public* addresses (a 10.x relay gives none), so a relay test needs public-looking ones. The
    namespaces have no route off the bridge either way, so nothing reaches the real 11.0.0.0/8.
    Namespace names carry a random tag, so concurrent tests (and other developers' runs) never collide.
    """
    if len(set(names)) != len(names) or not 0 < len(names) < 250:
        raise ValueError("give 1..249 distinct host names")
    tag = uuid.uuid4().hex[:8]
    switch = f"sn-{tag}-switch"
    created: list[str] = []
    try:
        _run("ip", "netns", "add", switch)
        created.append(switch)
        _run("ip", "-n", switch, "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "-n", switch, "link", "set", BRIDGE, "up")
        hosts = {}
        for i, name in enumerate(names, start=1):
            netns = f"sn-{tag}-{name}"
            _run("ip", "netns", "add", netns)
            created.append(netns)
            port = f"port{i}"
            _run("ip", "link", "add", HOST_IFACE, "netns", netns, "type", "veth", "peer", "name", port,
                 "netns", switch)  # fmt: skip
            _run("ip", "-n", switch, "link", "set", port, "master", BRIDGE)
            _run("ip", "-n", switch, "link", "set", port, "up")
            ip = f"{11 if public else 10}.{net}.0.{i}"
            _run("ip", "-n", netns, "addr", "add", f"{ip}/24", "dev", HOST_IFACE)
            _run("ip", "-n", netns, "link", "set", HOST_IFACE, "up")
            _run("ip", "-n", netns, "link", "set", "lo", "up")
            hosts[name] = Host(name, netns, ip)
        yield Network(hosts, switch)
    finally:
        for netns in reversed(created):  # deleting a namespace deletes its end of each veth pair
            with contextlib.suppress(Exception):
                _run("ip", "netns", "del", netns)


def leftover_namespaces(tag_prefix: str = "sn-") -> list[str]:
    """Namespaces named like ours that exist now (tests check they cleaned up)."""
    lines = _run("ip", "netns", "list").splitlines()
    return [line.split()[0] for line in lines if line.startswith(tag_prefix)]
