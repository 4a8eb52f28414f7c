"""A small typed client of the gateway's admin API (``/admin``): one method per route, JSON objects back. A call
ends in one of two errors when it does not succeed: ``AdminError`` (the gateway answered with an error) or
``GatewayUnreachable`` (no answer). Only httpx and the standard library: ``switchyard`` imports this at startup."""

from __future__ import annotations

from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

__all__ = ["DEFAULT_URL", "AdminClient", "AdminError", "GatewayUnreachable", "JSONObject"]

JSONObject = dict[str, Any]
DEFAULT_URL = "http://127.0.0.1:8000"
CONNECT_TIMEOUT_S = 10.0
"""A gateway that is up accepts at once: a wrong --url should not wait out a long action timeout."""


class AdminError(Exception):
    """The admin API answered ``status`` with ``{"error": message}``, plus ``step`` when a version action failed."""

    def __init__(self, message: str, status: int, step: str | None = None, details: JSONObject | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.step = step
        self.details = details or {}
        """What the answer carried beside the message and the step (an activation's ``replay`` report)."""

    @property
    def refused(self) -> bool:
        """401 / 403: no token, a wrong one, or the gateway runs without an admin token."""
        return self.status in (401, 403)


NOT_HTTP = "--url takes the gateway's HTTP address: is this its gRPC port?"


class GatewayUnreachable(Exception):
    """No answer came: nothing listens at the URL, the connection broke, or the answer took longer than the timeout
    (``timed_out``: the gateway may still be running the action). ``hint``: what to check, where the cause is known
    (something answered that speaks no HTTP/1.1)."""

    def __init__(self, url: str, reason: str, *, timed_out: bool = False, hint: str | None = None) -> None:
        super().__init__(f"cannot reach the gateway at {url}: {reason}")
        self.url = url
        self.reason = reason
        self.timed_out = timed_out
        self.hint = hint


class AdminClient:
    """Blocking, one connection pool; not shared between threads (the CLI's live view polls with a second one)."""

    def __init__(self, url: str, token: str | None, *, timeout_s: float) -> None:
        # "host:port" is what people type; httpx needs the scheme.
        self.url = (url if "://" in url else f"http://{url}").rstrip("/")
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S))
        try:
            self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        except httpx.InvalidURL as exc:
            raise GatewayUnreachable(self.url, f"invalid URL ({exc})") from None

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- reading --------------------------------------------------------------------------------------------
    def whoami(self) -> JSONObject:
        """The caller's actor and role; without a token the gateway's 401 names the tokens it takes."""
        return self._call("GET", "/admin/whoami")

    def models(self) -> JSONObject:
        return self._call("GET", "/admin/models")

    def model(self, model: str) -> JSONObject:
        return self._call("GET", _model_path(model))

    def events(self, model: str, limit: int | None = None) -> JSONObject:
        params = {"limit": str(limit)} if limit is not None else None
        return self._call("GET", f"{_model_path(model)}/events", params=params)

    # -- version actions: an option left at None is not sent, so the gateway's default applies ---------------
    def activate(
        self,
        model: str,
        version: int,
        *,
        keep_previous: bool | None = None,
        drain_timeout_s: float | None = None,
        compare: bool | None = None,
        verify_replay: JSONObject | None = None,
    ) -> JSONObject:
        """``verify_replay``: ``{"source", "limit"?, "atol"?, "rtol"?}``, the replay check before the flip."""
        options = _given(
            keep_previous=keep_previous, drain_timeout_s=drain_timeout_s, compare=compare, verify_replay=verify_replay
        )
        return self._call("POST", f"{_model_path(model)}/versions/{version}/activate", body=options)

    def rollback(
        self,
        model: str,
        *,
        keep_previous: bool | None = None,
        drain_timeout_s: float | None = None,
        compare: bool | None = None,
    ) -> JSONObject:
        options = _given(keep_previous=keep_previous, drain_timeout_s=drain_timeout_s, compare=compare)
        return self._call("POST", f"{_model_path(model)}/rollback", body=options)

    def load(self, model: str, version: int) -> JSONObject:
        return self._call("POST", f"{_model_path(model)}/versions/{version}/load")

    def unload(self, model: str, version: int, *, drain_timeout_s: float | None = None) -> JSONObject:
        options = _given(drain_timeout_s=drain_timeout_s)
        return self._call("POST", f"{_model_path(model)}/versions/{version}/unload", body=options)

    # -- traffic policies: ``None`` for the version clears the policy --------------------------------------------
    def traffic(
        self,
        model: str,
        canary: int | None,
        weight: float | None = None,
        *,
        sticky_header: str | None = None,
        max_error_rate: float | None = None,
        max_p99_ratio: float | None = None,
        window_s: float | None = None,
        min_requests: int | None = None,
        promote_after_s: float | None = None,
    ) -> JSONObject:
        """Sends what is given; the rollback object only when one of its fields is."""
        body: JSONObject = {"canary": canary}
        if canary is not None:
            rollback = _given(
                max_error_rate=max_error_rate, max_p99_ratio=max_p99_ratio, window_s=window_s, min_requests=min_requests
            )
            body |= _given(weight=weight, sticky_header=sticky_header, promote_after_s=promote_after_s)
            body |= {"rollback": rollback} if rollback else {}
        return self._call("PUT", f"{_model_path(model)}/traffic", body=body)

    def shadow(self, model: str, version: int | None, percent: float | None = None) -> JSONObject:
        body: JSONObject = {"version": version}
        if version is not None:
            body |= _given(percent=percent)
        return self._call("PUT", f"{_model_path(model)}/shadow", body=body)

    def scan(self) -> JSONObject:
        return self._call("POST", "/admin/repository/scan")

    def _call(
        self, method: str, path: str, *, body: JSONObject | None = None, params: dict[str, str] | None = None
    ) -> JSONObject:
        try:
            # No body at all when there are no options: the gateway then applies every default.
            response = self._http.request(method, path, json=body or None, params=params)
        except httpx.ConnectTimeout:
            raise GatewayUnreachable(
                self.url, f"no connection within {min(self.timeout_s, CONNECT_TIMEOUT_S):g} s"
            ) from None
        except httpx.TimeoutException:
            raise GatewayUnreachable(self.url, f"no answer within {self.timeout_s:g} s", timed_out=True) from None
        except httpx.RemoteProtocolError as exc:  # what a gRPC port (HTTP/2 only) answers an HTTP/1.1 request with
            reason = f"what answered speaks no HTTP/1.1 ({str(exc) or type(exc).__name__})"
            raise GatewayUnreachable(self.url, reason, hint=NOT_HTTP) from None
        except httpx.RequestError as exc:  # refused, reset, DNS, an undecodable body, a scheme httpx does not speak
            raise GatewayUnreachable(self.url, str(exc) or type(exc).__name__) from None
        return _decode(response)


def _decode(response: httpx.Response) -> JSONObject:
    try:
        data = response.json()
    except ValueError:  # also UnicodeDecodeError: whatever answered is not the admin API
        data = None
    if response.is_success and isinstance(data, dict):
        return data
    request = response.request
    answered = f"{request.method} {request.url.path} answered {response.status_code} {response.reason_phrase}"
    if not response.is_success and isinstance(data, dict) and isinstance(data.get("error"), str):
        step = data.get("step")
        message = data["error"]
        if message == response.reason_phrase:  # a bare status (no such route): say which route was asked for
            message = f"{answered}: is the URL the gateway's root?"
        details = {key: value for key, value in data.items() if key not in ("error", "step")}
        raise AdminError(message, response.status_code, step if isinstance(step, str) else None, details)
    root = f"{request.url.scheme}://{request.url.netloc.decode()}"
    raise AdminError(f"{answered} without an admin API answer: is {root} a Switchyard gateway?", response.status_code)


def _model_path(model: str) -> str:
    return f"/admin/models/{quote(model, safe='')}"


def _given(**options: object) -> JSONObject:
    return {name: value for name, value in options.items() if value is not None}
