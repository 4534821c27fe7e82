"""Helpers of the tests that start several workers on localhost."""

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on localhost right now (bound to port 0
    together, so the kernel picks distinct ones, then released)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
