"""Route table of the admin API; every admin error answers ``{"error": ...}`` with its status."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.gateway.admin.endpoints import AdminEndpoints

Handler = Callable[[Request], Awaitable[Response]]


def add_admin_routes(app: FastAPI, endpoints: AdminEndpoints) -> None:
    routes: list[tuple[str, Handler, str]] = [
        ("/admin/models", endpoints.models, "GET"),
        ("/admin/models/{model_name}", endpoints.model, "GET"),
        ("/admin/models/{model_name}/events", endpoints.events, "GET"),
        ("/admin/models/{model_name}/rollback", endpoints.rollback, "POST"),
        ("/admin/models/{model_name}/traffic", endpoints.traffic, "PUT"),
        ("/admin/models/{model_name}/shadow", endpoints.shadow, "PUT"),
        ("/admin/models/{model_name}/versions/{model_version}/activate", endpoints.activate, "POST"),
        ("/admin/models/{model_name}/versions/{model_version}/load", endpoints.load, "POST"),
        ("/admin/models/{model_name}/versions/{model_version}/unload", endpoints.unload, "POST"),
        ("/admin/repository/scan", endpoints.scan, "POST"),
    ]
    for path, handler, method in routes:
        app.router.routes.append(Route(path, handler, methods=[method]))
    tune = "/admin/models/{model_name}/tune"
    for handler, method in ((endpoints.tune_start, "POST"), (endpoints.tune_status, "GET")):
        app.router.routes.append(Route(tune, handler, methods=[method]))
