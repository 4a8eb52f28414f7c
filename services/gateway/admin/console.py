"""The ops console: ``GET /admin/ui`` serves a static single-page app shipped in this package (``ui/``);
``GET /admin/models/{m}/live`` gives one model's time series, ``GET /admin/console/models`` every model's status,
series and last swap in one answer (what the page polls: one request however many models), and
``POST /admin/models/{m}/versions/{v}/compare`` the swap protocol's output comparison of a loaded version with the
stable one, before anyone confirms a flip (it changes nothing). The page itself holds no secret and is served to
anyone; everything it shows or changes goes through the admin API with the token the user types in."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from services.gateway.admin.endpoints import admin_error_response
from services.gateway.admin.last_swap import LastSwaps
from services.gateway.admin.live import LiveFigures
from services.gateway.admin.query import whole_number
from services.gateway.admin.views import model_status
from services.gateway.errors import Conflict, GatewayError, InvalidInput, ModelNotFound
from services.gateway.repository import ModelEntry
from services.gateway.rest.responses import JSONBytesResponse
from services.gateway.rest.route_table import add_route_table
from services.gateway.shaping.admin_auth import AdminAuth
from services.gateway.tensors.types import VersionState
from services.gateway.versions.comparison import compare_versions
from services.gateway.versions.manager import VersionManager
from services.gateway.versions.numbers import parse_version
from services.modelrepo.layout import is_version_dir

UI = Path(__file__).with_name("ui")
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
"""Every file the page is made of: nothing else under ``/admin/ui`` is served."""
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'none'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}
MAX_MINUTES = 10
MAX_STEP_S = 60


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


def read_assets(folder: Path = UI) -> dict[str, Asset]:
    """The page's files, read once: a missing one is a packaging bug, reported at startup rather than as a
    broken page."""
    assets = {}
    for name, media_type in ASSETS.items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"the ops console's {path} is missing: the package was installed without it")
        body = path.read_bytes()
        assets[name] = Asset(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:20] + '"')
    return assets


class Console:
    def __init__(self, manager: VersionManager, auth: AdminAuth, live: LiveFigures) -> None:
        self._manager = manager
        self._auth = auth
        self._live = live
        self._swaps = LastSwaps(manager)
        self._assets = read_assets()

    async def page(self, request: Request) -> Response:
        # The HTML is never stored: a new gateway version brings new assets.
        return self._file("index.html", {"Cache-Control": "no-store"})

    async def asset(self, request: Request) -> Response:
        name = str(request.path_params["asset"])
        asset = self._assets.get(name)
        if asset is None or name == "index.html":
            return Response(b"not found\n", 404, media_type="text/plain", headers=SECURITY_HEADERS)
        if request.headers.get("if-none-match") == asset.etag:
            return Response(status_code=304, headers={**SECURITY_HEADERS, "ETag": asset.etag})
        return self._file(name, {"Cache-Control": "no-cache", "ETag": asset.etag})

    async def live(self, request: Request) -> Response:
        """Series of one model: ``minutes`` back (1 to 10, default 5), a point per ``step`` seconds (1 to 60,
        default 2)."""

        async def figures() -> dict[str, Any]:
            model = str(request.path_params["model_name"])
            self._manager.catalog.entry(model)
            return self._figures(model, *_span(request))

        return await _answer(self._auth, request, figures, operator=False)

    async def models(self, request: Request) -> Response:
        """Every model in one answer, what the page shows of each: its ``status`` (``GET /admin/models/{m}``),
        ``live`` series (``GET /admin/models/{m}/live``, with the same ``minutes`` and ``step``; ``null`` while no
        version of it is routed, where that call answers 404) and ``last_swap``, its newest activate or rollback in
        the audit log. One read per poll instead of two per model: the page is open when the gateway is in trouble."""

        async def every() -> dict[str, Any]:
            minutes, step_s = _span(request)
            catalog = self._manager.catalog
            swaps = await self._swaps.of(sorted(catalog.entries))
            models = []
            for name in sorted(catalog.entries):
                if name not in catalog.entries:  # a scan removed it while this read let requests through
                    continue
                models.append({
                    "name": name,
                    "status": model_status(self._manager, name),
                    "live": self._figures(name, minutes, step_s) if self._routed(name) else None,
                    "last_swap": swaps.get(name),
                })
                # A model's series take the loop a few milliseconds: requests are served between models, as they
                # were between per-model reads, rather than held for the whole repository's.
                await asyncio.sleep(0)
            return {"models": models}

        return await _answer(self._auth, request, every, operator=False)

    async def compare(self, request: Request) -> Response:
        """What an activation's ``compare`` step would report now: the same warm-up samples on a loaded version and
        on the stable one. Run as a version action (409 while another runs); nothing is loaded, routed or logged."""

        async def compared() -> dict[str, Any]:
            model = str(request.path_params["model_name"])
            version = _version(str(request.path_params["model_version"]))
            manager = self._manager
            entry = manager.catalog.entry(model)
            async with manager.exclusive(model, "compare", version):
                record = manager.router.record(model)
                if record is None:
                    raise Conflict(f"model '{model}' has no routing yet (no version of it serves)")
                if version == record.stable:
                    raise InvalidInput(f"version {version} is the stable version of model '{model}'")
                if manager.backend.state(model, version) is None:
                    await asyncio.to_thread(_on_disk, entry, version)  # 404 for a version the repository lacks
                for side in (version, record.stable):
                    if manager.backend.state(model, side) is not VersionState.READY:
                        raise Conflict(f"version {side} of model '{model}' is not loaded: an activation loads it and "
                                       "compares before the flip")
                timeout = manager.settings.warmup_timeout_s
                result = await compare_versions(manager.backend, entry, version, record.stable, None, timeout)
            return {"model": model, "version": version, "comparison": result}

        return await _answer(self._auth, request, compared)

    def _routed(self, model: str) -> bool:
        return self._manager.router.record(model) is not None

    def _figures(self, model: str, minutes: int, step_s: int) -> dict[str, Any]:
        record = self._manager.router.record(model)
        if record is None:
            raise ModelNotFound(f"model '{model}' has no routing yet")
        canary, shadow = record.canary, record.shadow
        return {
            "model": model,
            "minutes": minutes,
            "step_s": step_s,
            "sampled_every_s": self._live.period_s,
            "stable": record.stable,
            "canary": {"version": canary.version, "weight": canary.weight} if canary is not None else None,
            "shadow_policy": {"version": shadow.version, "percent": shadow.percent} if shadow is not None else None,
            **self._live.series(model, minutes=minutes, step_s=step_s),
        }

    def _file(self, name: str, headers: dict[str, str]) -> Response:
        asset = self._assets[name]
        return Response(asset.body, media_type=asset.media_type, headers={**SECURITY_HEADERS, **headers})


async def _answer(
    auth: AdminAuth, request: Request, action: Callable[[], Awaitable[dict[str, Any]]], *, operator: bool = True
) -> Response:
    """The admin API's answer: the token checked first (``operator``: not a read-only one; a comparison runs the
    versions, so it needs an operator), every error as the admin API answers it."""
    try:
        auth.check(request, operator=operator)
        return JSONBytesResponse(await action())
    except GatewayError as exc:
        return admin_error_response(request, exc)


def _span(request: Request) -> tuple[int, int]:
    """The series' ``minutes`` back (1 to 10, default 5) and ``step`` in seconds (1 to 60, default 2)."""
    minutes = whole_number(request.query_params.get("minutes"), "minutes", default=5, most=MAX_MINUTES)
    return minutes, whole_number(request.query_params.get("step"), "step", default=2, most=MAX_STEP_S)


def _on_disk(entry: ModelEntry, version: int) -> None:
    """``ModelNotFound`` (404, as an activation answers) when the repository has no such version: a "not loaded"
    conflict would send the operator to activate a version that does not exist. Blocking: reads the folder."""
    folder = entry.version_dir(version)
    if version not in entry.available and not is_version_dir(folder, entry.config):
        raise entry.missing(version)


def _version(raw: str) -> int:
    """The path's version, through the one parser every route uses."""
    version = parse_version(raw)
    if version is None:  # the route's pattern never matches an empty segment
        raise InvalidInput("the path names no version")
    return version


def add_console_routes(app: FastAPI, console: Console) -> None:
    # The page and its files are not API: out of the OpenAPI document (the JSON routes are in it).
    page = [
        ("/admin/ui", console.page, "GET"),
        ("/admin/ui/", console.page, "GET"),
        ("/admin/ui/{asset}", console.asset, "GET"),
    ]
    add_route_table(app, page, in_schema=False)
    api = [
        ("/admin/console/models", console.models, "GET"),
        ("/admin/models/{model_name}/live", console.live, "GET"),
        ("/admin/models/{model_name}/versions/{model_version}/compare", console.compare, "POST"),
    ]
    add_route_table(app, api)
