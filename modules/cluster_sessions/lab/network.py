"""The lab's network on this machine: a bridge holding the host address, one network namespace
per agent joined to it by a veth pair, and the iptables rules that keep lab traffic on the
bridge. Made by ``lab_up``, removed by ``lab_down``, looked at by ``lab_status``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .layout import NETNS_DIR, Layout
from .processes import run

Progress = Callable[[str], None]


def iptables_has(rule: list[str]) -> bool:
    chain, spec = rule[0], rule[1:]
    return run(["iptables", "-w", "-C", chain, *spec], check=False).returncode == 0


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def create_network(lay: Layout, agents: int, progress: Progress) -> None:
    br = lay.bridge
    if not link_exists(br):
        progress(f"bridge {br} {lay.bridge_address}/24")
        run(["ip", "link", "add", br, "type", "bridge"])
    addr = f"{lay.bridge_address}/{lay.subnet.prefixlen}"
    if addr not in run(["ip", "-o", "addr", "show", "dev", br]).stdout:
        run(["ip", "addr", "add", addr, "dev", br])
    run(["ip", "link", "set", br, "up"])
    for rule in lay.iptables_rules():
        if not iptables_has(rule):
            run(["iptables", "-w", "-I", rule[0], "1", *rule[1:]])
    for k in range(1, agents + 1):
        ns, veth = lay.netns(k), lay.veth(k)
        progress(f"namespace {ns} {lay.address(k)}")
        if not netns_exists(ns):
            run(["ip", "netns", "add", ns])
        if not link_exists(veth):
            run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                  "netns", ns])
        run(["ip", "link", "set", veth, "master", br, "up"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        a = f"{lay.address(k)}/{lay.subnet.prefixlen}"
        if a not in run(["ip", "-n", ns, "-o", "addr", "show", "dev", "eth0"]).stdout:
            run(["ip", "-n", ns, "addr", "add", a, "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        run(["ip", "-n", ns, "route", "replace", "default", "via", lay.bridge_address])



def remove_network(lay: Layout, agents: int, rules: list[list[str]]) -> None:
    """Delete the namespaces, veths, ``rules`` (duplicates too) and the bridge; what is already
    gone is skipped."""
    for k in range(1, agents + 1):
        if netns_exists(lay.netns(k)):
            run(["ip", "netns", "delete", lay.netns(k)], check=False)
        if link_exists(lay.veth(k)):
            run(["ip", "link", "delete", lay.veth(k)], check=False)
    for rule in rules:
        for _ in range(10):  # also duplicates
            if not iptables_has(rule):
                break
            run(["iptables", "-w", "-D", rule[0], *rule[1:]], check=False)
    if link_exists(lay.bridge):
        run(["ip", "link", "delete", lay.bridge], check=False)


def links_left(lay: Layout, agents: int) -> list[str]:
    """The bridge, namespaces and veths of the lab that still exist."""
    left = []
    if link_exists(lay.bridge):
        left.append(f"bridge {lay.bridge}")
    for k in range(1, agents + 1):
        if netns_exists(lay.netns(k)):
            left.append(f"netns {lay.netns(k)}")
        if link_exists(lay.veth(k)):
            left.append(f"veth {lay.veth(k)}")
    return left
