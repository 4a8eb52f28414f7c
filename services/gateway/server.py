"""Runs the app under uvicorn (uvloop + httptools) with gRPC on the same event loop."""

from __future__ import annotations

import asyncio
import logging
import resource
import socket

import uvicorn
from starlette.types import ASGIApp
from uvicorn.config import STARTUP_FAILURE

from services.gateway.app import create_app, preflight
from services.gateway.backends.triton import ConfigTransform
from services.gateway.repository import emptiness
from services.gateway.rest.connections import ConnectionLimits, protocol_class
from services.gateway.security import ServerTls, check_tls_files, server_tls
from services.gateway.settings import Settings

log = logging.getLogger(__name__)

# Descriptors the gateway needs besides HTTP connections: listeners, gRPC clients, Redis, model files, pipes.
FD_HEADROOM = 256


def uvicorn_config(
    settings: Settings, app: ASGIApp, *, log_level: str | None = None, tls: ServerTls | None = None
) -> uvicorn.Config:
    """How every gateway runs (``switchyard serve`` and ``tests.gateway_harness``): the connection limits are
    part of what is served and tested, not a production-only extra. With ``tls_cert_file`` the listener serves
    TLS from one ``SSLContext`` that ``security.ServerTls`` reloads when the files change: ``tls``, the app's
    (``app.state.tls``, which the gRPC listener and the certificate gauge share), else one built here (raises
    ``TlsError`` for files it cannot use)."""
    tls = tls or server_tls(settings)
    limits = ConnectionLimits(
        settings.header_timeout_s,
        settings.body_timeout_s,
        settings.max_connections,
        settings.max_header_bytes,
        settings.max_header_line_bytes,
        settings.max_header_count,
    )
    # The advertised idle timeout lets clients that honour it (undici, browsers) drop a connection before the
    # gateway closes it, the race in which a reused connection fails at the transport.
    keep_alive = [("keep-alive", f"timeout={int(settings.keep_alive_s)}")] if settings.keep_alive_s >= 1 else []
    protocol = protocol_class(limits, getattr(app, "lane", None))
    if tls is not None:  # a client of a CA removed from the CA file must not keep the connection it opened before
        tls.client_ca_removed.append(protocol.close_client_authenticated)
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        # Not limit_concurrency: uvicorn counts connections there only to answer requests 503 and keeps every
        # connection open (a silent one is never refused); the protocol closes connections beyond the cap instead.
        http=protocol,
        # No WebSocket routes: an upgrade would hand the transport to a protocol without the deadlines.
        ws="none",
        # uvicorn annotates int; call_later takes seconds as a float, and sub-second values serve tests.
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
        headers=keep_alive,
        server_header=False,  # no product banner to fingerprint (and one header less per answer)
        lifespan="on",
        log_level=log_level or settings.log_level,
        access_log=settings.access_log,
        ssl_context_factory=tls.uvicorn_factory if tls is not None else None,
    )


def check_fd_limit(settings: Settings) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    regions = settings.shared_memory_max_regions if settings.shared_memory else 0  # a descriptor each
    if soft != resource.RLIM_INFINITY and settings.max_connections + regions + FD_HEADROOM > soft:
        log.warning(
            "max_connections=%d (and %d shared-memory regions) leave too few of the %d file descriptors (ulimit -n) "
            "for the rest of the gateway; raise the limit or lower SWITCHYARD_MAX_CONNECTIONS below %d",
            settings.max_connections, regions, soft, max(soft - regions - FD_HEADROOM, 1),
        )


Listener = tuple[str, str, int]
"""A listener's protocol, the setting naming its port, and the port."""


class PortUnavailable(Exception):
    """A listener's port cannot be bound (in use, privileged, not an address of this host): one line naming the
    port and the variable that set it."""

    def __init__(self, listener: Listener, host: str, error: OSError) -> None:
        protocol, name, port = listener
        reason = (error.strerror or str(error)).lower()
        super().__init__(f"{protocol} cannot listen on {host}:{port}: {reason} (SWITCHYARD_{name.upper()}); choose a "
                         "free port, or stop what holds this one")


def listeners(settings: Settings) -> list[Listener]:
    """HTTP's, then gRPC's unless gRPC is off."""
    found = [("HTTP", "port", settings.port)]
    return found + ([("gRPC", "grpc_port", settings.grpc_port)] if settings.grpc_port is not None else [])


def check_ports(settings: Settings) -> None:
    """Bind each listener's port once and let it go, so that a port in use stops the start with one line naming it,
    before any model loads: uvicorn binds HTTP only after the lifespan, and a gRPC bind that fails inside the
    lifespan ends in a traceback. (A port taken in the moment between stays possible; the listeners then fail as
    before, later.)"""
    for listener in listeners(settings):
        if listener[2] == 0:  # the kernel picks a free port
            continue
        probe = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            # SO_REUSEADDR as the listeners have it: a previous run's connections in TIME_WAIT do not hold the port.
            # No SO_REUSEPORT: a port another node's workers share counts as held.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((settings.host, listener[2]))
        except OSError as exc:
            raise PortUnavailable(listener, settings.host, exc) from None
        finally:
            probe.close()


def check_startup(settings: Settings) -> None:
    """Raises ``RepositoryError`` / ``StateError`` / ``TlsError`` (one line each) when the gateway cannot start;
    warns of a file descriptor limit too low for its connections, and of a repository with no model in it."""
    check_fd_limit(settings)
    empty = emptiness(settings.repository)
    if empty is not None:
        log.warning("%s", empty)
    check_tls_files(settings)
    asyncio.run(preflight(settings))


def serve(settings: Settings, config_transform: ConfigTransform | None = None) -> None:
    """Raises ``RepositoryError`` / ``StateError`` (one line each) when the gateway cannot start."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_startup(settings)
    app = create_app(settings, config_transform=config_transform)
    check_ports(settings)
    server = uvicorn.Server(uvicorn_config(settings, app, tls=app.state.tls))
    server.run()
    if not server.started:  # the lifespan failed (its log says why): uvicorn returns as if it had served and stopped
        raise SystemExit(STARTUP_FAILURE)  # as uvicorn.run exits
