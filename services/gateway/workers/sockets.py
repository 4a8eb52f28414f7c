"""Listening sockets the node's workers share: each worker binds its own to the same port with ``SO_REUSEPORT``, and
the kernel spreads new connections over them (a connection stays with the worker that accepted it)."""

from __future__ import annotations

import socket


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: the kernel picks a port) with ``SO_REUSEPORT``, not listening: only
    listening sockets get connections. The supervisor's reservation of the node's ports never listens; a worker's
    socket listens once uvicorn serves it, after the worker's startup (its models loaded and warmed), so that no
    connection waits in the backlog of a worker that is still starting, or is lost with it if it fails to start."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
