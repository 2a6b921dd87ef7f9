"""Hosts on one machine: network namespaces joined to this one by veth pairs, so that bricks
run as servers on addresses of their own (10.77.N.2, reached from 10.77.N.1 here). This
kernel has no netem: latency is added by `delay` layers (`rtt = "9ms"`), not here.

Needs root and iproute2; `hosts(n)` skips the test otherwise."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid

import pytest


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def hosts(n: int):
    """Yields [(namespace, address)] for `n` hosts, removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = uuid.uuid4().hex[:6]
    made: list[tuple[str, str]] = []
    try:
        for i in range(n):
            ns, here, there = f"st-{tag}-{i}", f"vst{tag}{i}a", f"vst{tag}{i}b"
            subnet = f"10.77.{(int(tag, 16) + i) % 200 + 20}"
            _ip("netns", "add", ns)
            made.append((ns, here))
            _ip("link", "add", here, "type", "veth", "peer", "name", there)
            _ip("link", "set", there, "netns", ns)
            _ip("addr", "add", f"{subnet}.1/24", "dev", here)
            _ip("link", "set", here, "up")
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{subnet}.2/24", "dev", there)
            _ip("netns", "exec", ns, "ip", "link", "set", there, "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield [(ns, f"10.77.{(int(tag, 16) + i) % 200 + 20}.2") for i, (ns, _) in enumerate(made)]
    finally:
        for ns, here in made:
            subprocess.run(["ip", "link", "del", here], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
