"""Route table of the REST front end, listed explicitly, and the error handlers that give every
failure the v2 error shape."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException
from starlette.routing import Route

from services.gateway.errors import GatewayError
from services.gateway.rest.endpoints import Endpoints
from services.gateway.rest.lane import InferLane, LaneEndpoint
from services.gateway.rest.responses import error_response, gateway_error_response, internal_error
from services.gateway.rest.route_table import Handler, add_route_table

__all__ = ["Handler", "add_routes", "add_v2_routes"]  # Handler too: the extensions' route tables name it from here


def add_routes(app: FastAPI, endpoints: Endpoints, lane: InferLane) -> None:
    routes: list[tuple[str, Handler, str]] = [
        ("/v2", endpoints.server_metadata, "GET"),
        ("/v2/health/live", endpoints.live, "GET"),
        ("/v2/health/ready", endpoints.ready, "GET"),
        # Before /v2/models/{model_name}, which it would match: as in Triton, it shadows a model named "stats" there
        # (that model's statistics stay at /v2/models/stats/stats).
        ("/v2/models/stats", endpoints.statistics, "GET"),
        ("/v2/models/{model_name}/stats", endpoints.statistics, "GET"),
        ("/v2/models/{model_name}/versions/{model_version}/stats", endpoints.statistics, "GET"),
        ("/v2/models/{model_name}", endpoints.model_metadata, "GET"),
        ("/v2/models/{model_name}/versions/{model_version}", endpoints.model_metadata, "GET"),
        ("/v2/models/{model_name}/ready", endpoints.model_ready, "GET"),
        ("/v2/models/{model_name}/versions/{model_version}/ready", endpoints.model_ready, "GET"),
        ("/v2/models/{model_name}/config", endpoints.model_config, "GET"),
        ("/v2/models/{model_name}/versions/{model_version}/config", endpoints.model_config, "GET"),
        ("/metrics", endpoints.metrics, "GET"),
    ]
    add_v2_routes(app, routes)
    # Answered by the lane before FastAPI sees them (GatewayApp); listed so that other methods get 405, as in Triton.
    endpoint = LaneEndpoint(lane)
    for path in ("/v2/models/{model_name}/infer", "/v2/models/{model_name}/versions/{model_version}/infer"):
        app.router.routes.append(Route(path, endpoint, methods=["POST"]))
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)


def add_v2_routes(app: FastAPI, routes: Iterable[tuple[str, Handler, str]]) -> None:
    """``(path, handler, method)`` routes that answer every failure in the v2 error shape (extensions use it too)."""
    add_route_table(app, ((path, _guarded(handler), method) for path, handler, method in routes))


def _guarded(handler: Handler) -> Handler:
    """Every failure of a v2 route becomes its answer inside the route: an exception that reached the server would
    be answered 500 and the keep-alive connection dropped under the client's next request."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except GatewayError as exc:
            return gateway_error_response(exc)
        except Exception as exc:
            return internal_error(request.method, request.url.path, exc)

    return guarded


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return gateway_error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(str(exc.detail), exc.status_code)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    return internal_error(request.method, request.url.path, exc)
