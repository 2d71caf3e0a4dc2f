"""Loopback ports: is one free, and a few free ones for servers started by benchmarks and tests."""

from __future__ import annotations

import socket


def port_free(host: str, port: int) -> bool:
    """True when `port` can be bound on `host` right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports the OS considers free now (benchmarks and tests start servers on them)."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in ports:
            ports.append(port)
    return ports
