"""Registers a route table: each ``(path, handler, method)`` row becomes a plain Starlette route, so no dependency
injection or body model runs on the way (the handlers read their own requests)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["Handler", "add_route_table"]

Handler = Callable[[Request], Awaitable[Response]]


def add_route_table(app: FastAPI, routes: Iterable[tuple[str, Handler, str]], *, in_schema: bool = True) -> None:
    """``in_schema``: whether the routes are in the OpenAPI document."""
    for path, handler, method in routes:
        app.router.routes.append(Route(path, handler, methods=[method], include_in_schema=in_schema))
