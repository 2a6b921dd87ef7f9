"""Hosts on one machine: network namespaces joined to this one by veth pairs, so that bricks
run as servers on addresses of their own (10.77.N.2, reached from 10.77.N.1 here). This
kernel has no netem: latency is added by `delay` layers (`rtt = "9ms"`), not here.

Needs root and iproute2; `hosts(n)` skips the test otherwise."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import uuid

import pytest


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def address_lock():
    """Held while a test picks addresses for this machine and adds them: the suite runs in
    several processes at once (pytest-xdist), and two that picked the same free subnet
    before either added it would route each other's traffic."""
    with open("/tmp/strata-test-addresses.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _free_subnets(n: int, start: int) -> list[str]:
    """`n` subnets 10.77.X (X in 20..219, from `start` on) that no interface here uses."""
    taken = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True,
                           check=True, timeout=30).stdout
    subnets = []
    for step in range(200):
        subnet = f"10.77.{(start + step) % 200 + 20}"
        if f" {subnet}." not in taken:
            subnets.append(subnet)
            if len(subnets) == n:
                return subnets
    raise RuntimeError(f"no {n} free subnets in 10.77.20-219")


@contextlib.contextmanager
def hosts(n: int):
    """Yields [(namespace, address)] for `n` hosts, removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = uuid.uuid4().hex[:6]
    made: list[tuple[str, str]] = []
    addresses: list[str] = []
    try:
        with address_lock():
            for i, subnet in enumerate(_free_subnets(n, int(tag, 16))):
                ns, here, there = f"st-{tag}-{i}", f"vst{tag}{i}a", f"vst{tag}{i}b"
                _ip("netns", "add", ns)
                made.append((ns, here))
                _ip("link", "add", here, "type", "veth", "peer", "name", there)
                _ip("link", "set", there, "netns", ns)
                _ip("addr", "add", f"{subnet}.1/24", "dev", here)
                _ip("link", "set", here, "up")
                _ip("netns", "exec", ns, "ip", "addr", "add", f"{subnet}.2/24", "dev", there)
                _ip("netns", "exec", ns, "ip", "link", "set", there, "up")
                _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
                addresses.append(f"{subnet}.2")
        yield [(ns, address) for (ns, _), address in zip(made, addresses)]
    finally:
        for ns, here in made:
            subprocess.run(["ip", "link", "del", here], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
