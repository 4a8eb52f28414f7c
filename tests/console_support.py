"""Helpers of the ops console's browser tests and of its screenshot script: Debian's chromium driven by Playwright
(never a downloaded browser), a guard that records and blocks every request leaving the gateway's origin, and a
light background load (classifier or mlp requests) whose every answer is kept."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import quote, urlsplit

import httpx
import numpy as np
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Locator,
    Page,
    Request,
    Route,
    expect,
    sync_playwright,
)

from tests.slow_work import slow_work
from tests.swap_load import Answer, classifier_body
from tests.waiting import wait_until

TOKEN = "console-test-token"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
ACTION_TIMEOUT_MS = 60_000


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@contextmanager
def chromium(executable: str | None = None) -> Iterator[Browser]:
    """One headless Debian chromium for a module (starting one costs about two seconds)."""
    slow_work("starts a browser")
    path = executable or shutil.which("chromium")
    if path is None:
        raise RuntimeError("chromium is not installed: apt-get install --no-install-recommends chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=["--disable-gpu", "--disable-extensions"])
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class ConsolePage:
    """One browser context (its own sessionStorage) on the console of the gateway at ``base``."""

    page: Page
    context: BrowserContext
    base: str
    requests: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Console errors and uncaught exceptions of the page (a CSP violation shows up here)."""

    def open(self) -> None:
        self.page.goto(f"{self.base}/admin/ui")
        expect(self.page.locator("#login-form, #models-view").first).to_be_visible()

    def open_link(self, token: str = TOKEN) -> None:
        """Open the sign-in link ``switchyard console`` prints: the token in the URL fragment."""
        self.page.goto(f"{self.base}/admin/ui#token={quote(token, safe='')}")

    def sign_in(self, token: str = TOKEN) -> None:
        self.page.get_by_label("Admin token").fill(token)
        self.page.get_by_role("button", name="Sign in").click()

    def signed_in(self, token: str = TOKEN) -> None:
        self.open()
        self.sign_in(token)
        expect(self.model("classifier")).to_be_visible()

    def model(self, name: str) -> Locator:
        return self.page.locator(f'article[data-model="{name}"]')

    def field(self, model: str, name: str) -> Locator:
        return self.page.locator(f'article[data-model="{model}"] [data-field="{name}"]')

    def figure(self, model: str, name: str) -> float | None:
        """The number a live-figures cell shows now (``None`` for "–")."""
        return self.figures(model, name)[0]

    def figures(self, model: str, *names: str) -> tuple[float | None, ...]:
        """The numbers several live-figures cells show, read in one go: the page redraws every poll, and cells read
        one by one can come from two different polls."""
        texts = self.page.locator(f'article[data-model="{model}"]').evaluate(
            "(card, names) => names.map((name) => card.querySelector(`[data-figure='${name}'] .value`).textContent)",
            list(names),
        )
        numbers = (re.search(r"[-\d.]+", text) for text in texts)
        return tuple(float(match.group()) if match else None for match in numbers)

    def confirm(self, expect_result: str = "ok") -> str:
        """Confirm the open dialog, wait for the action's result, and close it; the result's text."""
        dialog = self.page.locator("#confirm")
        expect(dialog).to_be_visible()
        dialog.get_by_role("button", name="Confirm").click()
        progress = self.page.locator("#confirm-progress")
        expect(progress).to_have_text(re.compile(r"^(Done|Failed)"), timeout=ACTION_TIMEOUT_MS)
        result = self.page.locator("#confirm-result").inner_text()
        expect(progress).to_have_text("Failed" if expect_result == "failed" else f"Done: {expect_result}")
        return result

    def close_dialog(self) -> None:
        self.page.locator("#confirm").get_by_role("button", name="Close").click()
        expect(self.page.locator("#confirm")).to_be_hidden()

    def token_kept(self) -> str | None:
        value = self.page.evaluate("() => sessionStorage.getItem('switchyard.admin-token')")
        return value if isinstance(value, str) else None


@contextmanager
def console_page(
    browser: Browser, base: str, viewport: dict[str, int] | None = None, *, bypass_csp: bool = False
) -> Iterator[ConsolePage]:
    """A fresh context whose every request is recorded; one to another origin is aborted and kept in ``foreign``
    (``bypass_csp``: without the page's Content-Security-Policy, to check this guard on its own)."""
    context = browser.new_context(viewport=viewport or DESKTOP, bypass_csp=bypass_csp)  # type: ignore[arg-type]
    context.set_default_timeout(15_000)
    page = context.new_page()
    console = ConsolePage(page, context, base)
    own = origin(base)

    def guard(route: Route) -> None:
        if origin(route.request.url) == own:
            route.continue_()
        else:
            if route.request.url not in console.foreign:
                console.foreign.append(route.request.url)
            route.abort()

    def seen(request: Request) -> None:
        console.requests.append(request.url)
        if origin(request.url) != own and request.url not in console.foreign:
            console.foreign.append(request.url)

    def logged(message: ConsoleMessage) -> None:
        # An API error the page handled (the wrong token's 403) is logged by chromium as a failed load: not a problem.
        if message.type == "error" and "the server responded with a status of" not in message.text:
            console.problems.append(message.text)

    context.route("**/*", guard)
    page.on("request", seen)
    page.on("console", logged)
    page.on("pageerror", lambda error: console.problems.append(str(error)))
    try:
        yield console
    finally:
        context.close()


class BackgroundLoad:
    """``clients`` closed-loop clients sending unversioned classifier requests from a thread of their own, each
    pausing ``pause_s`` between requests (a light, steady load: the machine also runs a browser)."""

    def __init__(self, http_url: str, *, clients: int = 8, pause_s: float = 0.005, model: str = "classifier") -> None:
        self.url = f"http://{http_url}/v2/models/{model}/infer"
        self.model = model
        self.clients = clients
        self.pause_s = pause_s
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="console-load", daemon=True)

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        wait_until(lambda: bool(self.answers), 30.0)  # the load runs
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def failures(self) -> list[Answer]:
        return [answer for answer in self.answers if answer.status != 200]

    def versions(self) -> set[int | None]:
        return {answer.version for answer in self.answers}

    def during(self, start: float, end: float) -> list[Answer]:
        """The answers to requests sent between two ``time.monotonic()`` readings."""
        return [answer for answer in self.answers if start <= answer.sent <= end]

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.clients, max_keepalive_connections=self.clients)
        async with httpx.AsyncClient(limits=limits, timeout=30.0) as http:
            await asyncio.gather(*(self._client(http, index) for index in range(self.clients)))

    async def _client(self, http: httpx.AsyncClient, index: int) -> None:
        body, headers = classifier_body(index) if self.model == "classifier" else mlp_body(index)
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                response = await http.post(self.url, content=body, headers=headers)
                version = response.headers.get("x-model-version")
                error = "" if response.status_code == 200 else response.text[:200]
                answer = Answer(sent, time.monotonic(), response.status_code, int(version) if version else None, error)
            except httpx.HTTPError as exc:
                answer = Answer(sent, time.monotonic(), 0, None, repr(exc))
            self.answers.append(answer)
            await asyncio.sleep(self.pause_s)


def mlp_body(seed: int) -> tuple[bytes, dict[str, str]]:
    """One mlp row as a JSON request."""
    features = np.random.default_rng(seed).standard_normal(32).round(4).tolist()
    body = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": features}]}
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


def admin(http_url: str, method: str, path: str, body: object | None = None) -> dict[str, object]:
    """One admin API call (test setup and checks); raises on an error status."""
    response = httpx.request(
        method, f"http://{http_url}/admin/{path}", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60.0,
    )
    response.raise_for_status()
    data = response.json()
    assert isinstance(data, dict)
    return data
