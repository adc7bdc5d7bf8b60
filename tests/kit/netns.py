"""Hosts on one machine, and cuts between them: network namespaces on a bridge, and packets
between one namespace and one server's port dropped on the bridge's side, as a broken switch port
would drop them.

- ``Network``: N network namespaces, each joined to the machine by a veth pair. The machine's
  ends sit on a bridge that holds the machine's address on a private /24; each namespace has its
  own address on it. ``exec_prefix(n)`` runs a command in namespace n (``ip netns exec``). With
  a delay, every packet leaving a namespace waits that long (``tc qdisc … netem delay``), when
  the kernel has netem.
- ``Links``: the cuts. A cut is two ``u32`` filters on the bridge's end of the host's veth pair
  (a ``clsact`` qdisc): one on its ingress for what the host sends to the server's port, one on
  its egress for what comes back from it; both redirect those packets (``mirred``) to a sink, a
  device whose only queue holds no packet (``pfifo limit 0``), where they are dropped. Healing
  deletes the two filters. Neither end's own TCP stack is told (a drop in the sender's own queue
  would be, and Linux then times the connection out in seconds, which a real cut does not do).
  The machine has neither iptables nor nft, and its kernel neither ``netem`` nor the ``gact``
  drop action; clsact, u32 and mirred are what it offers.
- ``remove_stale()``: what runs killed outright (``-9``) left behind.

Root only. Used by tests/integration/test_network_cut.py and by the benchmarks that place
workers on hosts of their own (``bench.hosts``, ``bench.chaos --partitions``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from dataclasses import dataclass, field

PREFIX = "sjh"  # namespaces sjh<pid>-<n>, bridge sjb<pid>, host-side veths sjv<pid>h<n>
SUBNETS = ipaddress.ip_network("10.231.0.0/16")
# tc filter priorities, one per server, so a heal deletes only that server's filter.
FILTER_PRIO = {"PostgreSQL": "10", "Redis": "11"}


class NetworkError(RuntimeError):
    pass


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


@dataclass
class Network:
    hosts: int
    delay_ms: float
    tag: str = field(default_factory=lambda: str(os.getpid()))
    subnet: ipaddress.IPv4Network = field(init=False)
    made: list[tuple[str, str]] = field(default_factory=list)  # ("netns"|"link", name) to undo
    delay_note: str = ""

    @property
    def bridge(self) -> str:
        return f"sjb{self.tag}"

    @property
    def host_address(self) -> str:
        return str(self.subnet.network_address + 1)

    def namespace(self, n: int) -> str:
        return f"{PREFIX}{self.tag}-{n}"

    def address(self, n: int) -> str:
        return str(self.subnet.network_address + 10 + n)

    def exec_prefix(self, n: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(n)]

    def create(self) -> None:
        """The bridge and the namespaces; on a failure part-way, what was made is undone."""
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise

    def _create(self) -> None:
        self.subnet = _free_subnet()
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        sh("ip", "addr", "add", f"{self.host_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for n in range(self.hosts):
            ns, veth = self.namespace(n), f"sjv{self.tag}h{n}"
            sh("ip", "netns", "add", ns)
            self.made.append(("netns", ns))
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.made.append(("link", veth))
            sh("ip", "link", "set", veth, "master", self.bridge, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.address(n)}/{self.subnet.prefixlen}", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", self.host_address)
            if self.delay_ms > 0:
                added = sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root",
                           "netem", "delay", f"{self.delay_ms}ms", check=False)
                if added.returncode != 0:
                    self.delay_note = (f"no delay added: this kernel refused netem "
                                       f"({added.stderr.strip()})")
        if self.delay_ms > 0 and not self.delay_note:
            self.delay_note = f"netem delay {self.delay_ms:g} ms on each namespace's eth0 egress"
        elif not self.delay_note:
            self.delay_note = "no delay added (--delay-ms 0)"

    def destroy(self) -> None:
        # Each veth pair goes first, by its host end: a namespace outlives its deletion while a
        # process still runs in it (one killed, not yet reaped), and so would the pair, whose
        # names the next network of this process takes.
        for kind, name in reversed(self.made):
            if kind == "netns":
                sh("ip", "netns", "del", name, check=False)
            else:
                sh("ip", "link", "del", name, check=False)
        self.made.clear()


def _free_subnet() -> ipaddress.IPv4Network:
    taken = [ipaddress.ip_interface(address).network
             for address in re.findall(r"inet (\S+)", sh("ip", "-4", "addr").stdout)]
    for subnet in SUBNETS.subnets(new_prefix=24):
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise NetworkError(f"no free /24 in {SUBNETS}")


def remove_stale() -> list[str]:
    """Namespaces and bridges of earlier runs whose process is gone (a run killed with -9); returns
    the process ids of the runs whose leftovers it removed."""
    stale = set()
    for line in sh("ip", "netns", "list").stdout.splitlines():
        found = re.match(rf"({PREFIX}(\d+)-\d+)\b", line)
        if found and not _alive(int(found.group(2))):
            sh("ip", "netns", "del", found.group(1), check=False)
            stale.add(found.group(2))
    for line in sh("ip", "-o", "link", "show", "type", "bridge").stdout.splitlines():
        found = re.search(r"\bsjb(\d+):", line)
        if found and not _alive(int(found.group(1))):
            sh("ip", "link", "del", f"sjb{found.group(1)}", check=False)
            stale.add(found.group(1))
    # The sink of the cuts (Links): sjd<pid>a, a veth pair.
    for line in sh("ip", "-o", "link", "show", "type", "veth").stdout.splitlines():
        found = re.search(r"\bsjd(\d+)a[@:]", line)
        if found and not _alive(int(found.group(1))):
            sh("ip", "link", "del", f"sjd{found.group(1)}a", check=False)
            stale.add(found.group(1))
    return sorted(stale)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Links:
    """The filters that cut and heal one host's link to one server, on the host's end of the
    veth pair (the bridge side), and the device they send the cut packets to."""

    def __init__(self, network: Network, ports: dict[str, int]) -> None:
        self.network = network
        self.ports = ports

    @property
    def sink(self) -> str:
        return f"sjd{self.network.tag}a"

    def veth(self, n: int) -> str:
        return f"sjv{self.network.tag}h{n}"

    def prepare(self) -> None:
        # The sink: one end of a veth pair of its own, up, whose only queue holds no packet.
        sh("ip", "link", "add", self.sink, "type", "veth", "peer", "name", f"sjd{self.network.tag}b")
        self.network.made.append(("link", self.sink))
        for end in (self.sink, f"sjd{self.network.tag}b"):
            sh("ip", "link", "set", end, "up")
        sh("tc", "qdisc", "add", "dev", self.sink, "root", "pfifo", "limit", "0")
        for n in range(self.network.hosts):
            sh("tc", "qdisc", "add", "dev", self.veth(n), "clsact")

    def cut(self, n: int, server: str) -> None:
        # What the host sends to the server (ingress of the bridge's end), and what the server
        # sends back (egress towards the host).
        for hook, field_ in (("ingress", "dport"), ("egress", "sport")):
            sh("tc", "filter", "add", "dev", self.veth(n), hook, "protocol", "ip", "prio",
               FILTER_PRIO[server], "u32", "match", "ip", field_, str(self.ports[server]), "0xffff",
               "action", "mirred", "egress", "redirect", "dev", self.sink)

    def heal(self, n: int, server: str) -> int:
        """Remove the cut; returns the packets it dropped."""
        dropped = self.dropped(n, server)
        for hook in ("ingress", "egress"):
            sh("tc", "filter", "del", "dev", self.veth(n), hook, "prio", FILTER_PRIO[server], check=False)
        return dropped

    def dropped(self, n: int, server: str) -> int:
        total = 0
        for hook in ("ingress", "egress"):
            shown = sh("tc", "-s", "filter", "show", "dev", self.veth(n), hook, "prio",
                       FILTER_PRIO[server], check=False).stdout
            total += sum(int(found) for found in re.findall(r"Sent \d+ bytes (\d+) pkt", shown))
        return total
