"""Swagger UI at ``/docs`` from packaged assets, so that it works without reaching a CDN."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

DOCS_PATH = "/docs"
_ASSETS_PATH = "/docs/assets"
# fastapi-offline ships Swagger UI 5 (OpenAPI 3.1, which FastAPI writes) next to its module.
_ASSETS = Path(fastapi_offline.__file__).parent / "static"


def install_docs(app: FastAPI) -> None:
    """``/docs`` renders ``app.openapi_url``; its script, style sheet and icon come from ``/docs/assets``."""

    async def docs(request: Request) -> Response:
        root = request.scope.get("root_path", "")  # behind a proxy that strips a prefix, as FastAPI's own /docs
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{_ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{_ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{_ASSETS_PATH}/favicon.png",
        )

    app.router.routes.append(Route(DOCS_PATH, docs, methods=["GET"], include_in_schema=False))
    app.mount(_ASSETS_PATH, StaticFiles(directory=_ASSETS), name="docs-assets")
