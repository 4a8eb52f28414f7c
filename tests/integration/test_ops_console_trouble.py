"""The ops console when what it shows could mislead: a model whose requests stopped (no latency from minutes ago
shown as now), and a gateway that stops answering and comes back (no action offered on what the page last read)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.console_support import TOKEN, ConsolePage, admin, chromium, console_page, mlp_body
from tests.gateway_process import GatewayProcess, gateway_process
from tests.system_tools import require_tool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium(require_tool("chromium", "chromium")) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """mlp alone, versions 1 and 2 (2 stable, no previous)."""
    work = tmp_path_factory.mktemp("console-trouble")
    shutil.copytree(repository / "mlp", work / "repository" / "mlp")
    with gateway_process(work / "repository", work, token=TOKEN) as running:
        yield running


@pytest.fixture
def console(browser: Browser, gateway: GatewayProcess) -> Iterator[ConsolePage]:
    with console_page(browser, f"http://{gateway.http_url}") as page:
        page.open_link()
        expect(page.model("mlp")).to_be_visible()
        yield page
        assert page.foreign == [], "the console sent requests outside the gateway"


def test_console_shows_a_zero_rate_and_no_latency_when_the_model_has_had_no_request_lately(
    console: ConsolePage, gateway: GatewayProcess
) -> None:
    # Nothing was ever sent to mlp: a rate of 0 (the gateway did read its counters), and no latency at all.
    assert wait_until(lambda: console.figures("mlp", "stable-rps", "stable-p50_ms") == (0.0, None), 30.0), \
        console.figures("mlp", "stable-rps", "stable-p50_ms")
    for seed in range(20):
        body, headers = mlp_body(seed)
        assert httpx.post(f"http://{gateway.http_url}/v2/models/mlp/infer", content=body, headers=headers).is_success
    # The requests show up: a rate, a latency, a 5xx rate of 0.
    assert wait_until(lambda: console.figures("mlp", "stable-p50_ms")[0] is not None, 30.0)
    # No request since: once the requests are more than a few steps old, no latency or 5xx rate is shown as the
    # model's state now (the sparklines still draw them), only a rate of 0.
    assert wait_until(lambda: console.figures("mlp", "stable-rps", "stable-p50_ms", "stable-p99_ms",
                                              "stable-error_rate") == (0.0, None, None, None), 40.0), \
        console.figures("mlp", "stable-rps", "stable-p50_ms", "stable-p99_ms", "stable-error_rate")
    expect(console.model("mlp").locator('td[data-figure="stable-p50_ms"] svg path')).to_have_count(1)
    assert console.problems == []


HOLD_A_READ = """
(() => {
  // The next read of the models (the poll's one read) is answered by the gateway at once and handed to the page only
  // when the test says so: a poll that a newer one overtakes, as on a slow link.
  const fetched = window.fetch.bind(window);
  window.__hold = { armed: false, held: false, release: null, delivered: false };
  window.fetch = async (input, init) => {
    const response = await fetched(input, init);
    const hold = window.__hold;
    if (hold.armed && new URL(String(input), location.href).pathname === "/admin/console/models") {
      hold.armed = false;
      hold.held = true;
      await new Promise((resolve) => { hold.release = resolve; });
      hold.delivered = true;
    }
    return response;
  };
})();
"""
WATCH_CANARY = """
() => {
  window.__canary = [];
  const card = document.querySelector('article[data-model="mlp"]');
  const note = () => {
    const field = card.querySelector('[data-field="canary"]');
    if (field) window.__canary.push(field.textContent);
  };
  new MutationObserver(note).observe(card, { subtree: true, childList: true, characterData: true });
}
"""


def test_console_never_draws_an_older_read_over_a_newer_one_when_a_poll_is_overtaken(
    browser: Browser, gateway: GatewayProcess
) -> None:
    with console_page(browser, f"http://{gateway.http_url}") as console:
        page = console.page
        page.add_init_script(HOLD_A_READ)
        console.open_link()
        expect(console.field("mlp", "canary")).to_have_text("none")
        page.evaluate(WATCH_CANARY)
        page.evaluate("() => { window.__hold.armed = true; }")
        page.wait_for_function("() => window.__hold.held")  # a poll read "no canary" and waits
        try:
            admin(gateway.http_url, "PUT", "models/mlp/traffic", {"canary": 1, "weight": 20})
            page.evaluate("() => { location.hash = '#/events'; }")  # a new view, then back: each starts a new read
            expect(page.locator("#events-view")).to_be_visible()
            page.evaluate("() => { location.hash = '#/models'; }")
            expect(console.field("mlp", "canary")).to_have_text("v1 at 20 %")
            page.evaluate("() => window.__hold.release()")
            page.wait_for_function("() => window.__hold.delivered")
            # Two more polls after the overtaken one came back: had it drawn its card, "none" shows up in between.
            shown = len(page.evaluate("() => window.__canary"))
            page.wait_for_function(f"() => window.__canary.length >= {shown + 2}", timeout=15_000)
            seen = page.evaluate("() => window.__canary")
            first = seen.index("v1 at 20 %")
            assert "none" not in seen[first:], seen
        finally:
            admin(gateway.http_url, "PUT", "models/mlp/traffic", {"canary": None})


def test_console_offers_no_action_while_the_gateway_does_not_answer_and_again_once_it_does(
    console: ConsolePage, gateway: GatewayProcess
) -> None:
    card = console.model("mlp")
    activate = card.get_by_role("button", name="Activate version 1 of mlp")
    controls = [activate, card.get_by_role("button", name="Set canary"), card.get_by_label("Weight (%)"),
                card.get_by_role("button", name="Clear shadow")]
    for control in controls:
        expect(control).to_be_enabled()
    gateway.stop()
    try:
        trouble = console.page.locator("#trouble")
        expect(trouble).to_have_text(re.compile(r"^Update failed — no answer: the gateway did not answer"))
        # What the card shows may no longer be true: nothing on it acts until the page reads the gateway again.
        for control in controls:
            expect(control).to_be_disabled()
        assert card.locator("button:enabled, input:enabled, select:enabled").count() == 0
        expect(trouble).to_contain_text("The models shown are as of the last update")
    finally:
        gateway.start()
    expect(console.page.locator("#trouble")).to_have_text("", timeout=30_000)
    for control in controls:
        expect(control).to_be_enabled()
    # What the state itself disables stays so: mlp has no previous version to roll back to.
    expect(card.get_by_role("button", name="Roll back (no previous version)")).to_be_disabled()


def test_console_keeps_the_keyboard_on_the_model_when_an_action_took_its_button_away(
    console: ConsolePage, gateway: GatewayProcess
) -> None:
    page = console.page
    card = console.model("mlp")
    try:
        card.get_by_role("button", name="Activate version 1 of mlp").focus()
        page.keyboard.press("Enter")
        confirm = page.get_by_role("button", name="Confirm")
        expect(confirm).to_be_enabled(timeout=30_000)  # after the comparison's preview
        page.keyboard.press("Tab")
        expect(confirm).to_be_focused()
        page.keyboard.press("Enter")
        expect(page.locator("#confirm-progress")).to_have_text("Done: ok", timeout=60_000)
        expect(page.get_by_role("button", name="Close")).to_be_focused()
        page.keyboard.press("Enter")
        expect(page.locator("#confirm")).to_be_hidden()
        # Version 1 is stable now and has no Activate button: the focus is on its model's card, not lost to the page
        # (where the next Tab would start again from the top), and stays there once the card shows the new routing.
        expect(console.field("mlp", "stable")).to_have_text("v1")
        expect(card).to_be_focused()
        page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.closest('article')?.dataset.model") == "mlp"
        assert console.problems == []
    finally:
        admin(gateway.http_url, "POST", "models/mlp/versions/2/activate")
