"""Where the gRPC users connect when ``--grpc-target`` is not given: the host of ``--host`` at the gRPC port the
gateway advertises (``grpc_port`` in ``GET /v2``), else at the HTTP port + 1 (the gateway's defaults are 8000 and
8001). Each target says which rule found it, for the start-up log and for the users' connection failures.
Standard library only: the unit tests import it without locust (which patches the interpreter with gevent)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_GRPC_PORT = 8001
"""The gateway's default gRPC port, for a URL that names no port (the HTTP port is then the scheme's)."""
ASK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class GrpcTarget:
    address: str
    """HOST:PORT, as ``grpc.insecure_channel`` takes it."""
    rule: str
    """How it was found, in words."""


def given(address: str) -> GrpcTarget:
    return GrpcTarget(address, "given by --grpc-target (GRPC_TARGET)")


def advertised(url: str, port: int) -> GrpcTarget:
    return GrpcTarget(f"{_host(url)}:{port}", f"the port the gateway advertises (grpc_port in GET {url}/v2)")


def offset(url: str, why: str) -> GrpcTarget:
    """The fallback: HTTP port + 1; ``why`` says why the gateway's own answer was not used."""
    port = _http_port(url)
    if port is None:
        rule = f"the default gRPC port: {url or '--host'} names no port ({why})"
        return GrpcTarget(f"{_host(url)}:{DEFAULT_GRPC_PORT}", rule)
    return GrpcTarget(f"{_host(url)}:{port + 1}", f"HTTP port + 1, the default offset ({why})")


def read_grpc_port(body: bytes) -> int:
    """``grpc_port`` from a ``GET /v2`` body; ValueError saying what the body held instead."""
    try:
        metadata = json.loads(body)
    except ValueError:
        raise ValueError(f"GET /v2 did not answer JSON: {body[:80]!r}") from None
    if not isinstance(metadata, dict):
        raise ValueError(f"GET /v2 answered {type(metadata).__name__}, expected a JSON object")
    if "grpc_port" not in metadata:
        raise ValueError("GET /v2 names no grpc_port (gRPC is off, or the server is no Switchyard gateway)")
    port = metadata["grpc_port"]
    # bool is an int in Python: true must not pass for port 1.
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"GET /v2 has grpc_port {port!r}, expected a port number from 1 to 65535")
    return port


def resolve(url: str, grpc_target: str) -> GrpcTarget:
    """The target to use: ``grpc_target`` when given, else asked of the gateway at ``url``, else the offset."""
    if grpc_target:
        return given(grpc_target)
    _http_port(url)  # a malformed port fails here, naming --host, before any request
    try:
        with urllib.request.urlopen(f"{url}/v2", timeout=ASK_TIMEOUT_S) as answer:
            return advertised(url, read_grpc_port(answer.read()))
    except (OSError, ValueError) as exc:  # urllib's errors (HTTPError, URLError, timeouts) are OSErrors
        return offset(url, _reason(url, exc))


def _reason(url: str, exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"GET {url}/v2 answered {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return f"GET {url}/v2 failed: {exc.reason}"
    if isinstance(exc, ValueError):
        return str(exc)
    return f"GET {url}/v2 failed: {exc}"


def _host(url: str) -> str:
    host = urlsplit(url).hostname or "127.0.0.1"
    return f"[{host}]" if ":" in host else host  # an IPv6 literal keeps its brackets in HOST:PORT


def _http_port(url: str) -> int | None:
    try:
        return urlsplit(url).port
    except ValueError:
        raise ValueError(f"--host {url!r} has no valid port, expected http://HOST[:PORT]") from None
