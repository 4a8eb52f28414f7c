"""Route table of the REST front end, listed explicitly, and the error handlers that give every
failure the v2 error shape."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException
from starlette.routing import Route

from services.gateway.errors import GatewayError
from services.gateway.rest.endpoints import Endpoints
from services.gateway.rest.responses import error_response

log = logging.getLogger(__name__)


def add_routes(app: FastAPI, endpoints: Endpoints) -> None:
    routes: list[tuple[str, Callable[[Request], Awaitable[Response]], str]] = [
        ("/v2", endpoints.server_metadata, "GET"),
        ("/v2/health/live", endpoints.live, "GET"),
        ("/v2/health/ready", endpoints.ready, "GET"),
        ("/v2/models/{model_name}", endpoints.model_metadata, "GET"),
        ("/v2/models/{model_name}/versions/{model_version}", endpoints.model_metadata, "GET"),
        ("/v2/models/{model_name}/ready", endpoints.model_ready, "GET"),
        ("/v2/models/{model_name}/versions/{model_version}/ready", endpoints.model_ready, "GET"),
        ("/v2/models/{model_name}/config", endpoints.model_config, "GET"),
        ("/v2/models/{model_name}/versions/{model_version}/config", endpoints.model_config, "GET"),
        ("/v2/models/{model_name}/infer", endpoints.infer, "POST"),
        ("/v2/models/{model_name}/versions/{model_version}/infer", endpoints.infer, "POST"),
        ("/metrics", endpoints.metrics, "GET"),
    ]
    # Plain Starlette routes: no dependency injection or body models on the hot path, the codec parses.
    for path, handler, method in routes:
        app.router.routes.append(Route(path, handler, methods=[method]))
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    # 503s are expected during a backend outage (the backend logs the transition once); log the rest.
    if exc.status >= 500 and exc.status != 503 and exc.reason is None:
        log.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc)
    response = error_response(str(exc), exc.status)
    if exc.retry_after_s is not None:
        response.headers["Retry-After"] = str(exc.retry_after_s)
    if exc.version is not None:  # which version failed: what a canary's watcher (and its operator) needs
        response.headers["X-Model-Version"] = str(exc.version)
    return response


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(str(exc.detail), exc.status_code)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response("internal server error", 500)
