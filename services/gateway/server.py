"""Runs the app under uvicorn (uvloop + httptools) with gRPC on the same event loop."""

from __future__ import annotations

import asyncio
import logging
import resource

import uvicorn
from starlette.types import ASGIApp

from services.gateway.app import create_app, preflight
from services.gateway.backends.triton import ConfigTransform
from services.gateway.rest.connections import ConnectionLimits, protocol_class
from services.gateway.security import check_tls_files, server_tls
from services.gateway.settings import Settings

log = logging.getLogger(__name__)

# Descriptors the gateway needs besides HTTP connections: listeners, gRPC clients, Redis, model files, pipes.
FD_HEADROOM = 256


def uvicorn_config(settings: Settings, app: ASGIApp, *, log_level: str | None = None) -> uvicorn.Config:
    """How every gateway runs (``switchyard serve`` and ``tests.gateway_harness``): the connection limits are
    part of what is served and tested, not a production-only extra. With ``tls_cert_file`` the listener serves
    TLS from one ``SSLContext`` that ``security.ServerTls`` reloads when the files change (raises ``TlsError``
    for files it cannot use)."""
    tls = server_tls(settings)
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
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        # Not limit_concurrency: uvicorn counts connections there only to answer requests 503 and keeps every
        # connection open (a silent one is never refused); the protocol closes connections beyond the cap instead.
        http=protocol_class(limits, getattr(app, "lane", None)),
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


def check_startup(settings: Settings) -> None:
    """Raises ``RepositoryError`` / ``StateError`` / ``TlsError`` (one line each) when the gateway cannot start;
    warns of a file descriptor limit too low for its connections."""
    check_fd_limit(settings)
    check_tls_files(settings)
    asyncio.run(preflight(settings))


def serve(settings: Settings, config_transform: ConfigTransform | None = None) -> None:
    """Raises ``RepositoryError`` / ``StateError`` (one line each) when the gateway cannot start."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_startup(settings)
    app = create_app(settings, config_transform=config_transform)
    uvicorn.Server(uvicorn_config(settings, app)).run()
