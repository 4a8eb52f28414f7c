"""Admin API handlers: authenticate, parse, call the version manager, answer JSON. Nothing here is counted in
the inference metrics, and none of it is reachable over gRPC."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from services.gateway.admin.query import whole_number
from services.gateway.admin.views import model_status, overview
from services.gateway.errors import GatewayError, InvalidInput, SwapFailed, Unauthorized
from services.gateway.rest.body import read_json_object
from services.gateway.rest.responses import JSONBytesResponse, gateway_error_response
from services.gateway.settings import Settings
from services.gateway.shaping.admin_auth import AdminAuth
from services.gateway.state.policies import CanaryPolicy, InferenceLogPolicy, ShadowPolicy
from services.gateway.tuning.options import TuneOptions, TuneOptionsError
from services.gateway.tuning.service import TuneService
from services.gateway.versions.loading import load_version, unload_version
from services.gateway.versions.manager import VersionManager
from services.gateway.versions.numbers import parse_version
from services.gateway.versions.replay_check import ReplayOptions
from services.gateway.versions.reports import ReportedSwapFailure
from services.gateway.versions.traffic import set_canary, set_inference_log, set_shadow

log = logging.getLogger(__name__)
T = TypeVar("T")
_SWITCH_OPTIONS: dict[str, type] = {"keep_previous": bool, "drain_timeout_s": float, "compare": bool}
_ACTIVATE_OPTIONS: dict[str, type] = {**_SWITCH_OPTIONS, "verify_replay": ReplayOptions}
_UNLOAD_OPTIONS: dict[str, type] = {"drain_timeout_s": float}
MAX_EVENTS = 1000


class AdminEndpoints:
    def __init__(
        self, manager: VersionManager, auth: AdminAuth, settings: Settings, *, tuner: TuneService | None = None
    ) -> None:
        self._manager = manager
        self._tuner = tuner
        self._auth = auth
        self._max_drain_s = settings.max_drain_timeout_s
        self._max_body = settings.max_body_bytes

    async def models(self, request: Request) -> Response:
        return await self._answer(request, lambda actor: _ready(overview(self._manager)), operator=False)

    async def model(self, request: Request) -> Response:
        async def status(actor: str) -> Any:
            return model_status(self._manager, _model(request))

        return await self._answer(request, status, operator=False)

    async def whoami(self, request: Request) -> Response:
        """The caller's actor (as the audit log names it) and role: what the console may offer it."""
        try:
            caller = self._auth.identify(request.headers.get("authorization"))
        except GatewayError as exc:
            return admin_error_response(request, exc)
        return JSONBytesResponse({"actor": caller.actor, "role": caller.role})

    async def activate(self, request: Request) -> Response:
        async def act(actor: str) -> Any:
            options = self._options(await self._body(request), _ACTIVATE_OPTIONS)
            report = await self._manager.activate(_model(request), _version(request), actor=actor, **options)
            return report.to_json()

        return await self._answer(request, act)

    async def rollback(self, request: Request) -> Response:
        async def act(actor: str) -> Any:
            options = self._options(await self._body(request), _SWITCH_OPTIONS)
            return (await self._manager.rollback(_model(request), actor=actor, **options)).to_json()

        return await self._answer(request, act)

    async def load(self, request: Request) -> Response:
        async def act(actor: str) -> Any:
            self._options(await self._body(request), {})
            return (await load_version(self._manager, _model(request), _version(request), actor=actor)).to_json()

        return await self._answer(request, act)

    async def unload(self, request: Request) -> Response:
        async def act(actor: str) -> Any:
            options = self._options(await self._body(request), _UNLOAD_OPTIONS)
            report = await unload_version(self._manager, _model(request), _version(request), actor=actor, **options)
            return report.to_json()

        return await self._answer(request, act)

    async def traffic(self, request: Request) -> Response:
        async def act(actor: str) -> Any:
            fields = await self._body(request)
            if fields.get("canary") is None:
                canary = None
            else:
                fields["version"] = fields.pop("canary")
                canary = _parsed(CanaryPolicy.from_json, fields, {"since", "rolled_back"})
            return (await set_canary(self._manager, _model(request), canary, actor)).to_json()

        return await self._answer(request, act)

    async def shadow(self, request: Request) -> Response:
        async def act(actor: str) -> Any:
            fields = await self._body(request)
            if fields.get("version") is None:
                return (await set_shadow(self._manager, _model(request), None, actor)).to_json()
            shadow, note = _parsed(ShadowPolicy.from_request, fields, set())
            answer = (await set_shadow(self._manager, _model(request), shadow, actor)).to_json()
            if note is not None:
                log.warning("shadow of model '%s': %s", _model(request), note)
                answer["deprecated"] = note
            return answer

        return await self._answer(request, act)

    async def inference_log(self, request: Request) -> Response:
        """``{"percent": 0-100 or null, "redact": {...}}`` sets the model's own inference-log policy; ``{}`` or
        ``{"percent": null}`` without redactions goes back to the gateway's settings."""

        async def act(actor: str) -> Any:
            asked = _parsed(InferenceLogPolicy.from_request, await self._body(request), set())
            policy = None if asked.sample is None and not asked.redact else asked
            return (await set_inference_log(self._manager, _model(request), policy, actor)).to_json()

        return await self._answer(request, act)

    async def events(self, request: Request) -> Response:
        async def act(actor: str) -> Any:
            model = _model(request)
            self._manager.catalog.entry(model)
            limit = whole_number(request.query_params.get("limit"), "limit", default=100, most=MAX_EVENTS)
            return {"events": [event.to_json() for event in await self._manager.audit_events(model, limit)]}

        return await self._answer(request, act, operator=False)

    async def all_events(self, request: Request) -> Response:
        """The newest ``limit`` events of the audit log, every model's (the console's "All models": one read, not
        one per model)."""

        async def act(actor: str) -> Any:
            limit = whole_number(request.query_params.get("limit"), "limit", default=100, most=MAX_EVENTS)
            return {"events": [event.to_json() for event in await self._manager.audit_events(None, limit)]}

        return await self._answer(request, act, operator=False)

    async def scan(self, request: Request) -> Response:
        return await self._answer(request, lambda actor: self._manager.scan(actor=actor))

    async def tune_start(self, request: Request) -> Response:
        """Starts a tuning run in the background: 202 with its first status, 409 while one runs."""

        async def act(actor: str) -> Any:
            tuner = self._tuning()
            try:
                options = TuneOptions.from_json(await self._body(request))
            except TuneOptionsError as exc:
                raise InvalidInput(str(exc)) from None
            return tuner.start(_model(request), options, actor).to_json()

        response = await self._answer(request, act)
        if response.status_code == 200:
            response.status_code = 202
        return response

    async def tune_status(self, request: Request) -> Response:
        """The model's current tuning run, or (``?run=<id>``) the run of that id."""

        async def status(actor: str) -> Any:
            return self._tuning().status(_model(request), request.query_params.get("run")).to_json()

        return await self._answer(request, status, operator=False)

    async def tune_cancel(self, request: Request) -> Response:
        """Stops the model's running tuning run (``?run=<id>``: only if that is it; 409 naming both ids if not);
        answers once its trials are unloaded, with its final status."""

        async def act(actor: str) -> Any:
            run = request.query_params.get("run")
            return (await self._tuning().cancel(_model(request), actor, run)).to_json()

        return await self._answer(request, act)

    def _tuning(self) -> TuneService:
        if self._tuner is None:
            raise GatewayError("tuning is not available in this gateway", 503)
        return self._tuner

    async def _answer(
        self, request: Request, action: Callable[[str], Awaitable[Any]], *, operator: bool = True
    ) -> Response:
        """``operator``: the call changes something (a read-only admin token gets 403)."""
        try:
            actor = self._auth.check(request, operator=operator)
            return JSONBytesResponse(await action(actor))
        except GatewayError as exc:
            return admin_error_response(request, exc)

    async def _body(self, request: Request) -> dict[str, Any]:
        return await read_json_object(request, self._max_body)

    def _options(self, data: dict[str, Any], allowed: dict[str, type]) -> dict[str, Any]:
        """The optional JSON body's options: only the allowed keys, each of its type."""
        names = ", ".join(allowed) or "none"
        options: dict[str, Any] = {}
        for key, value in data.items():
            kind = allowed.get(key)
            if kind is None:
                raise InvalidInput(f"unknown option {key!r}; expected: {names}")
            if kind is ReplayOptions:
                value = ReplayOptions.from_json(value)
            if kind is bool and not isinstance(value, bool):
                raise InvalidInput(f"option {key!r} must be true or false, got {value!r}")
            if kind is float:
                if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= self._max_drain_s:
                    raise InvalidInput(f"option {key!r} must be a number of seconds from 0 to {self._max_drain_s:g}")
                value = float(value)
            options[key] = value
        return options


def admin_error_response(request: Request, exc: GatewayError) -> Response:
    """The admin API's answer to an error: the common error response (``Retry-After``, ``X-Request-Id``, the
    error's headers), the failed step of a version action beside the message, the bearer challenge on a 401."""
    fields = {"step": exc.step} if isinstance(exc, SwapFailed) else None
    if isinstance(exc, ReportedSwapFailure):  # e.g. the replay check's report: which answers differed
        fields = {"step": exc.step, **exc.details}
    response = gateway_error_response(exc, fields=fields)
    if isinstance(exc, Unauthorized):
        response.headers["WWW-Authenticate"] = 'Bearer realm="switchyard-admin"'
    if exc.status >= 500 and exc.status != 503:
        log.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc)
    return response


def _parsed(parse: Callable[[object], T], fields: dict[str, Any], internal: set[str]) -> T:
    """A policy from the request, with the fields only the gateway sets refused like unknown ones."""
    for name in internal & set(fields):
        raise InvalidInput(f"{name!r} is set by the gateway, not by a request")
    try:
        return parse(fields)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


async def _ready(value: Any) -> Any:
    return value


def _model(request: Request) -> str:
    return str(request.path_params["model_name"])


def _version(request: Request) -> int:
    """The path's version, through the one parser every route uses (no ``0``, no ``01``)."""
    version = parse_version(str(request.path_params["model_version"]))
    if version is None:  # the route's pattern never matches an empty segment
        raise InvalidInput("the path names no version")
    return version
