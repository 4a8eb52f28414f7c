"""The ops console in a real browser (Debian's chromium through Playwright) against a real gateway in its own
process: sign-in (typed, and by the link `switchyard console` prints), both example models, the models that need
attention first, the filter, the forms showing the live canary and shadow, one time format, an activation and a
rollback under load with no failed request, a canary at 20 % with both sides' figures moving, the audit log; and no
request ever leaves the gateway's origin."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect

from services.inferlog.format import FORMAT
from services.keyfile.format import AdminEntry, hash_secret, presented_admin_token
from services.keyfile.writing import write_entries
from tests.console_support import PHONE, TOKEN, BackgroundLoad, ConsolePage, admin, chromium, console_page, mlp_body
from tests.gateway_process import GatewayProcess, gateway_on_copy, gateway_process
from tests.system_tools import require_tool
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium(require_tool("chromium", "chromium")) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """classifier and mlp, versions 1 and 2 loaded; the classifier's stable version set to 1 (2 is the previous)."""
    with gateway_on_copy(repository, tmp_path_factory.mktemp("console"), token=TOKEN) as running:
        admin(running.http_url, "POST", "models/classifier/versions/1/activate")
        yield running


COPIES = ("mlp_a", "mlp_b", "mlp_c", "mlp_d")
SWAPS = ("activate", "rollback")


@pytest.fixture(scope="module")
def many(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Seven models: classifier, mlp, four copies of mlp, and ``broken``, none of whose versions loads (so none is
    routed: it has no live figures)."""
    work = tmp_path_factory.mktemp("console-many")
    root = work / "repository"
    for model in ("classifier", "mlp"):
        shutil.copytree(repository / model, root / model)
    for name in (*COPIES, "broken"):
        shutil.copytree(repository / "mlp", root / name)
        config = root / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "mlp"', f'name: "{name}"', 1))
    for version in ("1", "2"):
        (root / "broken" / version / "model.onnx").write_bytes(b"not an onnx model")
    with gateway_process(root, work, token=TOKEN) as running:
        yield running


def repository_of(gateway: GatewayProcess) -> Path:
    """The gateway's own copy of the repository (``gateway_on_copy``): a test may change it."""
    return Path(gateway.command[gateway.command.index("--repository") + 1])


@pytest.fixture
def console(browser: Browser, gateway: GatewayProcess) -> Iterator[ConsolePage]:
    with console_page(browser, f"http://{gateway.http_url}") as page:
        yield page
        assert page.foreign == [], "the console sent requests outside the gateway"
        assert page.problems == [], "the page logged errors (a CSP violation is one)"


def test_console_refuses_sign_in_with_a_clear_message_when_the_token_is_wrong(console: ConsolePage) -> None:
    console.open()
    console.sign_in("not-the-token")
    expect(console.page.locator("#login-error")).to_have_text(
        "Sign-in refused — HTTP 403: the admin token is not valid"
    )
    expect(console.page.locator("#models-view")).to_be_hidden()
    assert console.token_kept() is None
    console.sign_in("")
    expect(console.page.locator("#login-error")).to_have_text("Type the admin token first.")
    # A sign-in link goes through the same checks, and its token leaves the address bar either way.
    console.open_link("not-the-token")
    expect(console.page.locator("#login-error")).to_have_text(
        "Sign-in refused — HTTP 403: the admin token is not valid"
    )
    assert "token" not in console.page.url
    # A token that stops working (the gateway restarted with another one) signs the tab out, saying why.
    console.page.evaluate("() => sessionStorage.setItem('switchyard.admin-token', 'an-old-token')")
    console.page.reload()
    expect(console.page.locator("#login-error")).to_have_text("Signed out — HTTP 403: the admin token is not valid")
    assert console.token_kept() is None


def test_console_checks_catch_a_request_when_the_page_leaves_the_gateway(
    browser: Browser, gateway: GatewayProcess
) -> None:
    """Both checks can fail: the page's CSP refuses a request to another origin (and chromium logs it), and the
    test's own guard records and aborts one even without the CSP."""
    leave = "() => fetch('https://cdn.example.com/lib.js').then(() => 'fetched', (err) => 'blocked: ' + err.name)"
    with console_page(browser, f"http://{gateway.http_url}") as console:
        console.open()
        assert console.page.evaluate(leave) == "blocked: TypeError"
        assert any("Content Security Policy" in problem for problem in console.problems), console.problems
    with console_page(browser, f"http://{gateway.http_url}", bypass_csp=True) as console:
        console.open()
        assert console.page.evaluate(leave) == "blocked: TypeError"
        assert console.foreign == ["https://cdn.example.com/lib.js"]


def test_console_shows_both_example_models_when_signed_in(console: ConsolePage, gateway: GatewayProcess) -> None:
    console.signed_in()
    expect(console.model("mlp")).to_be_visible()
    expect(console.field("classifier", "stable")).to_have_text("v1")
    expect(console.field("classifier", "previous")).to_have_text("v2")
    expect(console.field("mlp", "stable")).to_have_text("v2")
    rows = console.model("classifier").locator("table tbody tr[data-version]")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator('[data-field="state"]')).to_have_text("READY")
    expect(rows.nth(1).locator('[data-field="role"]')).to_have_text("previous")
    # A version on disk but not loaded is listed as such, and loads from the page.
    admin(gateway.http_url, "POST", "models/mlp/versions/1/unload")
    row = console.model("mlp").locator('tr[data-version="1"]')
    expect(row.locator('[data-field="state"]')).to_have_text("on disk, not loaded")
    row.get_by_role("button", name="Load version 1 of mlp").click()
    console.confirm()
    console.close_dialog()
    expect(row.locator('[data-field="state"]')).to_have_text("READY")
    # The token lives in this tab's sessionStorage only: no cookie, not in the URL.
    assert console.token_kept() == TOKEN
    assert console.context.cookies() == []
    assert TOKEN not in console.page.url
    assert all(TOKEN not in url for url in console.requests)


def test_console_orders_filters_and_shows_the_live_policies_when_signed_in_by_link(
    console: ConsolePage, gateway: GatewayProcess
) -> None:
    page = console.page
    mlp, classifier = console.model("mlp"), console.model("classifier")
    try:
        admin(gateway.http_url, "PUT", "models/mlp/traffic", {"canary": 1, "weight": 20})
        admin(gateway.http_url, "PUT", "models/classifier/shadow", {"version": 2, "percent": 25})
        console.open_link()
        expect(mlp).to_be_visible()
        assert "token" not in page.url  # gone from the address bar (and, replaced, from the tab's history)
        assert page.evaluate("() => location.hash") == "#/models"
        assert console.token_kept() == TOKEN
        expect(console.field("mlp", "canary")).to_have_text("v1 at 20 %")
        # The forms show the live policies, not defaults; and the model with a canary comes first (by name it is
        # second), each with the badges that say why.
        expect(mlp.get_by_label("Canary version")).to_have_value("1")
        expect(mlp.get_by_label("Weight (%)")).to_have_value("20")
        expect(classifier.get_by_label("Shadow version")).to_have_value("2")
        expect(classifier.get_by_label("Share (%)")).to_have_value("25")
        expect(page.locator("article.model").first).to_have_attribute("data-model", "mlp")
        expect(mlp.locator('[data-reason="canary"]')).to_have_text("canary v1 at 20 %")
        expect(classifier.locator('[data-reason="shadow"]')).to_have_text("shadow v2 on 25 %")

        # A field being edited keeps what is typed there; once left, it shows the live weight again.
        mlp.get_by_label("Weight (%)").fill("55")
        admin(gateway.http_url, "PUT", "models/mlp/traffic", {"canary": 1, "weight": 30})
        expect(console.field("mlp", "canary")).to_have_text("v1 at 30 %")
        expect(mlp.get_by_label("Weight (%)")).to_have_value("55")
        page.locator("#models-title").click()
        expect(mlp.get_by_label("Weight (%)")).to_have_value("30")

        # One time format: ISO 8601 UTC, the age in the tooltip.
        iso_utc = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$")
        for time_element in (page.locator("#updated time"), console.field("mlp", "updated").locator("time")):
            expect(time_element).to_have_text(iso_utc)
            expect(time_element).to_have_attribute("title", re.compile(r"^\d+ (s|min) ago$"))

        page.get_by_label("Filter models").fill("CLASS")
        expect(mlp).to_be_hidden()
        expect(classifier).to_be_visible()
        expect(page.locator("#models-count")).to_have_text("1 of 2 models match “CLASS”.")
        page.reload()  # the filter is in the URL's query, the token in the tab's session storage
        expect(classifier).to_be_visible()
        expect(page.get_by_label("Filter models")).to_have_value("CLASS")
        expect(mlp).to_be_hidden()
        page.get_by_label("Filter models").fill("")
        expect(mlp).to_be_visible()
        assert "filter" not in page.url
    finally:
        admin(gateway.http_url, "PUT", "models/mlp/traffic", {"canary": None})
        admin(gateway.http_url, "PUT", "models/classifier/shadow", {"version": None})


def test_console_activates_and_rolls_back_without_a_failed_request_when_under_load(
    console: ConsolePage, gateway: GatewayProcess
) -> None:
    console.signed_in()
    with BackgroundLoad(gateway.http_url) as load:
        console.page.get_by_role("button", name="Activate version 2 of classifier").click()
        expect(console.page.locator("#confirm-title")).to_have_text("Activate version 2 of classifier?")
        expect(console.page.locator("#confirm-preview")).to_contain_text(
            re.compile(r"^Preview: the same requests on both versions, compared with v1 .* logits: \d")
        )
        confirmed = time.monotonic()
        result = console.confirm()
        reported = time.monotonic()
        assert "activate of classifier" in result
        assert re.search(r"compared with v1 on the warm-up samples before the flip.*logits: \d", result), result
        console.close_dialog()
        expect(console.field("classifier", "stable")).to_have_text("v2")
        expect(console.field("classifier", "previous")).to_have_text("v1")
        expect(console.model("classifier").locator(".part.last")).to_contain_text("activate v1 → v2: ok")
        during_activation = load.during(confirmed, reported)

        console.page.get_by_role("button", name="Roll back to v1").click()
        console.confirm()
        console.close_dialog()
        expect(console.field("classifier", "stable")).to_have_text("v1")
        rolled_back = time.monotonic()
        # The load goes on until version 1 answers a request sent after the rollback, and 100 were sent in all.
        assert wait_until(
            lambda: len(load.answers) > 100 and any(a.version == 1 and a.sent > rolled_back for a in load.answers),
            30.0,
        )
    print(f"\nbackground load: {len(load.answers)} requests ({len(during_activation)} sent while the activation ran "
          f"for {reported - confirmed:.2f} s), {len(load.failures())} failed, "
          f"versions {sorted(v for v in load.versions() if v is not None)}")
    assert load.failures() == []
    assert len(during_activation) >= 10  # the activation did run under load
    assert len(load.answers) > 100
    assert load.versions() == {1, 2}
    assert admin(gateway.http_url, "GET", "models/classifier")["routing"]["stable"] == 1  # type: ignore[index]


def test_console_shows_both_sides_figures_moving_when_a_canary_takes_20_percent(
    console: ConsolePage, gateway: GatewayProcess
) -> None:
    console.signed_in()
    card = console.model("classifier")
    with BackgroundLoad(gateway.http_url) as load:
        card.get_by_label("Canary version").select_option("2")
        card.get_by_label("Weight (%)").fill("20")
        card.get_by_role("button", name="Set canary").click()
        expect(console.page.locator("#confirm-title")).to_have_text("Send 20 % of classifier's traffic to version 2?")
        console.confirm()
        console.close_dialog()
        expect(console.field("classifier", "canary")).to_have_text("v2 at 20 %")
        expect(card.locator('th:has-text("Canary v2 (20 %)")')).to_be_visible()
        # The first reading's 2 s step may reach back before the split; two polls later every step is after it.
        seen: list[tuple[float | None, ...]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            reading = console.figures("classifier", "stable-rps", "canary-rps")
            if not seen or reading != seen[-1]:
                seen.append(reading)
            if len(seen) > 2 and all(side and side > 0 for side in reading):
                break
            time.sleep(0.25)
        stable_rps, canary_rps = seen[-1]
        assert len(seen) > 2, f"the figures did not move: {seen}"
        assert stable_rps, seen
        assert canary_rps, seen
        assert 0.05 < canary_rps / (stable_rps + canary_rps) < 0.45, seen  # 20 % give or take a noisy 2 s step
        assert console.figure("classifier", "canary-p50_ms") is not None
        assert console.figure("classifier", "stable-p99_ms") is not None
        expect(card.locator('[data-field="canary-window"]')).to_contain_text("canary")
        expect(card.locator('td[data-figure="canary-rps"] svg path')).to_have_count(1)
    admin(gateway.http_url, "PUT", "models/classifier/traffic", {"canary": None})
    assert load.failures() == []
    assert {1, 2} <= load.versions()


def test_console_shows_the_api_error_verbatim_when_an_action_fails(
    console: ConsolePage, gateway: GatewayProcess
) -> None:
    model_file = repository_of(gateway) / "mlp" / "1" / "model.onnx"
    original = model_file.read_bytes()
    admin(gateway.http_url, "POST", "models/mlp/versions/1/unload")
    model_file.write_bytes(b"not an onnx model")
    try:
        console.signed_in()
        console.model("mlp").get_by_role("button", name="Load version 1 of mlp").click()
        console.confirm(expect_result="failed")
        error = console.page.locator('#confirm-result [data-field="api-error"]')
        expect(error).to_have_text(re.compile(
            r"^HTTP 422 \(failed at step 'load'\): load of model 'mlp' version 1 failed at step 'load': .+"
        ))
        console.close_dialog()
        state = console.model("mlp").locator('tr[data-version="1"] [data-field="state"]')
        # The failed load left nothing loaded; why it failed stays on the version's row (the backend's words)
        expect(state).to_contain_text("on disk, not loaded — loading failed: [ONNXRuntimeError]")
        # A version that failed needs attention even though its load was undone: the model comes first, saying why.
        failing = console.model("mlp").locator('[data-reason="failing"]')
        expect(failing).to_have_text("failing: v1")
        expect(failing).to_have_attribute("title", re.compile(r"^v1 loading failed: \[ONNXRuntimeError\]"))
        expect(console.page.locator("article.model").first).to_have_attribute("data-model", "mlp")
    finally:
        model_file.write_bytes(original)


def test_console_lists_events_newest_first_when_filtered_by_model(
    console: ConsolePage, gateway: GatewayProcess
) -> None:
    console.signed_in()
    card = console.model("mlp")
    card.get_by_label("Shadow version").select_option("1")
    card.get_by_label("Share (%)").fill("50")
    card.get_by_role("button", name="Set shadow").click()
    console.confirm()
    console.close_dialog()
    expect(console.field("mlp", "shadow")).to_have_text("v1 on 50 %")
    card.get_by_role("button", name="Clear shadow").click()
    console.confirm()
    console.close_dialog()
    expect(console.field("mlp", "shadow")).to_have_text("none")
    console.page.get_by_role("link", name="Events").click()
    rows = console.page.locator("#events-table tbody tr")
    expect(rows.first).to_have_attribute("data-model", "mlp")
    expect(rows.first).to_contain_text("shadow cleared")
    expect(rows.nth(1)).to_contain_text("shadow v1 on 50 %")
    expect(console.page.locator('#events-table tbody tr[data-model="classifier"]').first).to_be_visible()
    times = console.page.locator("#events-table tbody time").evaluate_all("nodes => nodes.map(n => n.dateTime)")
    assert times == sorted(times, reverse=True)

    console.page.get_by_label("Model", exact=True).select_option("classifier")
    expect(console.page.locator('#events-table tbody tr[data-model="mlp"]')).to_have_count(0)
    expect(rows.first).to_have_attribute("data-model", "classifier")
    expect(console.page.locator('#events-table tbody tr[data-action="startup"]')).to_have_count(1)


def test_console_is_usable_by_keyboard_and_on_a_phone_when_acting(browser: Browser, gateway: GatewayProcess) -> None:
    with console_page(browser, f"http://{gateway.http_url}", viewport=PHONE) as console:
        console.open()
        page = console.page
        expect(page.get_by_label("Admin token")).to_be_focused()  # the sign-in form takes the focus
        page.keyboard.press("Shift+Tab")
        expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
        page.keyboard.press("Tab")
        page.keyboard.type(TOKEN)
        page.keyboard.press("Enter")
        expect(console.model("classifier")).to_be_visible()
        page.keyboard.press("/")  # the shortcut to the model filter
        expect(page.get_by_label("Filter models")).to_be_focused()
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"the page is {width}px wide on a {PHONE['width']}px phone"
        load = page.get_by_role("button", name="Unload version 2 of classifier")
        load.focus()
        page.keyboard.press("Enter")
        expect(page.locator("#confirm")).to_be_visible()
        expect(page.get_by_role("button", name="Cancel")).to_be_focused()
        page.keyboard.press("Escape")
        expect(page.locator("#confirm")).to_be_hidden()
        expect(load).to_be_focused()
        assert console.foreign == []
        assert console.problems == []


def test_console_requests_stay_on_the_gateway_origin_when_every_view_is_used(
    console: ConsolePage, gateway: GatewayProcess
) -> None:
    console.signed_in()
    console.page.get_by_role("link", name="Events").click()
    expect(console.page.locator("#events-table tbody tr").first).to_be_visible()
    console.page.get_by_role("link", name="Models").click()
    expect(console.model("mlp")).to_be_visible()
    console.page.get_by_role("button", name="Sign out").click()
    expect(console.page.get_by_label("Admin token")).to_be_visible()
    assert console.token_kept() is None
    own = f"http://{gateway.http_url}/"
    paths = {url.removeprefix(own).split("?")[0] for url in console.requests}
    assert {"admin/ui", "admin/ui/console.js", "admin/ui/console.css", "admin/console/models", "admin/events"} <= paths
    assert [url for url in console.requests if not url.startswith(own)] == []
    assert console.foreign == []


def test_console_shows_the_last_replay_check_when_an_activation_was_refused_by_it(
    console: ConsolePage, gateway: GatewayProcess, tmp_path: Path
) -> None:
    """A log of what version 2 answered, as the gateway's inference log writes it; version 1 checked against it is
    refused, and the model's card says so with the figures of the check."""
    records = []
    for seed in range(5):
        body, headers = mlp_body(seed)
        answer = httpx.post(f"http://{gateway.http_url}/v2/models/mlp/versions/2/infer", content=body, headers=headers)
        request = json.loads(body)
        records.append({
            "format": FORMAT, "id": f"r{seed}", "trace_id": None, "time": "2026-12-05T06:00:00Z", "model": "mlp",
            "version": 2, "route": "pinned", "protocol": "http", "latency_ms": 1.0, "status": 200, "error": None,
            "truncated": False, "redacted": [], "request": {"inputs": request["inputs"], "outputs": None},
            "response": {"outputs": [{key: output[key] for key in ("name", "datatype", "shape", "data")}
                                     for output in answer.json()["outputs"]]},
        })
    (tmp_path / "inference-20261205T060000000000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    refused = httpx.post(
        f"http://{gateway.http_url}/admin/models/mlp/versions/1/activate", headers={"Authorization": f"Bearer {TOKEN}"},
        json={"verify_replay": {"source": str(tmp_path)}}, timeout=60,
    )
    assert refused.status_code == 422, refused.text
    console.signed_in()
    line = console.field("mlp", "replay")
    expect(line).to_contain_text("Replay check of v1")
    expect(line).to_contain_text("refused; 5 of 5 logged requests compared, 5 differing")
    expect(console.field("mlp", "stable")).to_have_text("v2")


def test_console_offers_a_read_only_token_no_action_and_an_operator_every_one(
    browser: Browser, repository: Path, tmp_path: Path
) -> None:
    """Tokens of the keys file: a read-only one sees the models and their figures, and no form or version button
    (the API would refuse them with 403); an operator's sees them all. Who is signed in is shown beside sign-out;
    with the model cache on, whether a model is loaded."""
    keys_file = tmp_path / "keys.toml"
    viewer, oncall = (presented_admin_token(name, f"secret-of-{name}") for name in ("viewer", "oncall"))
    write_entries(keys_file, {}, {
        "viewer": AdminEntry("viewer", (hash_secret("secret-of-viewer"),), "read-only"),
        "oncall": AdminEntry("oncall", (hash_secret("secret-of-oncall"),), "operator"),
    })
    shutil.copytree(repository / "mlp", tmp_path / "repository" / "mlp")
    with (
        # With the model cache on (and nothing sent yet), the card says the model is not loaded.
        gateway_process(tmp_path / "repository", tmp_path, token=TOKEN, api_keys_file=str(keys_file),
                        model_cache_mb="100") as gateway,
        console_page(browser, f"http://{gateway.http_url}") as console,
    ):
        console.open_link(viewer)
        card = console.model("mlp")
        expect(console.field("mlp", "memory")).to_have_text("not loaded (loads on its next request)")
        expect(card.locator('tr[data-version="2"] [data-field="state"]')).to_have_text("on disk, not loaded")
        expect(console.page.locator("#caller")).to_have_text("admin:viewer (read-only)")
        expect(card.get_by_role("button")).to_have_count(0)
        expect(card.locator("form")).to_have_count(0)

        console.page.get_by_role("button", name="Sign out").click()
        console.open_link(oncall)
        expect(console.page.locator("#caller")).to_have_text("admin:oncall (operator)")
        expect(card.get_by_role("button", name="Activate version 1 of mlp")).to_be_visible()
        expect(card.get_by_role("button", name="Set canary")).to_be_visible()
        assert console.problems == []


def per_model(http: httpx.Client, name: str, query: dict[str, int]) -> dict[str, object]:
    """What the console read of one model before the bulk read: its status, live figures and newest swap event."""
    status = http.get(f"/admin/models/{name}")
    assert status.status_code == 200, status.text
    live = http.get(f"/admin/models/{name}/live", params=query)
    if live.status_code == 404:  # no version routed: the bulk answer says null
        assert live.json() == {"error": f"model '{name}' has no routing yet"}
    events = http.get(f"/admin/models/{name}/events", params={"limit": 200}).json()["events"]
    swaps = [event for event in events if event["action"] in SWAPS]
    return {
        "name": name,
        "status": status.json(),
        "live": live.json() if live.status_code == 200 else None,
        "last_swap": max(swaps, key=lambda event: event["time"]) if swaps else None,
    }


def test_console_bulk_read_equals_the_per_model_reads_when_the_repository_has_several_models(
    many: GatewayProcess,
) -> None:
    url = many.http_url
    admin(url, "POST", "models/classifier/versions/1/activate")  # a swap in the audit log
    admin(url, "PUT", "models/mlp_a/traffic", {"canary": 1, "weight": 30})
    admin(url, "PUT", "models/mlp_b/shadow", {"version": 1, "percent": 50})
    for seed in range(20):
        body, headers = mlp_body(seed)
        for model in ("mlp_a", "mlp_b"):
            assert httpx.post(f"http://{url}/v2/models/{model}/infer", content=body, headers=headers).is_success
    query = {"minutes": 1, "step": 1}
    with httpx.Client(base_url=f"http://{url}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
        names = [model["name"] for model in http.get("/admin/models").json()["models"]]
        assert names == sorted(["classifier", "mlp", *COPIES, "broken"])

        def counted() -> int:
            series = http.get("/admin/models/mlp_a/live", params=query).json()["versions"]
            return int(sum(point["requests"] for version in series for point in version["points"]))

        assert wait_until(lambda: counted() == 20, 30.0), counted()  # the gateway has read its counters since
        reads: list[tuple[object, object, object]] = []

        def still() -> bool:
            """The per-model reads between two bulk reads that are equal: the figures did not move meanwhile (the
            gateway reads its counters every second while watched)."""
            before = http.get("/admin/console/models", params=query).json()
            each = {"models": [per_model(http, name, query) for name in names]}
            after = http.get("/admin/console/models", params=query).json()
            reads[:] = [(before, each, after)]
            return bool(before == after)

        assert wait_until(still, 60.0), "the figures moved during every bracketed read"
        bulk, each, _ = reads[0]
        assert bulk == each
        by_name = {model["name"]: model for model in bulk["models"]}  # type: ignore[index]
        # What equal answers must hold, lest they be equal by being empty.
        assert by_name["broken"]["live"] is None
        assert by_name["classifier"]["last_swap"]["versions"] == {"from": 2, "to": 1}
        assert by_name["mlp_a"]["status"]["routing"]["canary"]["weight"] == 30
        assert sum(point["requests"] for series in by_name["mlp_a"]["live"]["versions"]
                   for point in series["points"]) == 20
        assert by_name["mlp_b"]["live"]["shadow_policy"] == {"version": 1, "percent": 50.0}

        # Every model's audit log in one read: the same events as the per-model reads, in the same order.
        every = http.get("/admin/events", params={"limit": 1000}).json()["events"]
        one_by_one = [event for name in names
                      for event in http.get(f"/admin/models/{name}/events", params={"limit": 1000}).json()["events"]]
        assert sorted(every, key=lambda event: event["time"]) == every
        assert sorted(every, key=json.dumps) == sorted(one_by_one, key=json.dumps)
        assert {event["model"] for event in every} == set(names) - {"broken"}  # never routed: nothing logged


COUNT_READS = """
(() => {
  // Every read the page makes, in order, and a mark where each poll ends (the header's "Updated" time is redrawn).
  const fetched = window.fetch.bind(window);
  window.__reads = [];
  window.fetch = (input, init) => {
    window.__reads.push(new URL(String(input), location.href).pathname);
    return fetched(input, init);
  };
  document.addEventListener("DOMContentLoaded", () => {
    const mark = () => window.__reads.push("|poll|");
    new MutationObserver(mark).observe(document.getElementById("updated"), { childList: true });
  });
})();
"""


def polls_after(console: ConsolePage, polls: int) -> list[list[str]]:
    """The reads of each of the next ``polls`` whole polls (from the next poll's start)."""
    page = console.page
    start = page.evaluate("() => window.__reads.length")
    page.wait_for_function(
        f"() => window.__reads.slice({start}).filter((read) => read === '|poll|').length >= {polls + 1}"
    )
    reads: list[str] = page.evaluate(f"() => window.__reads.slice({start})")
    whole = "\n".join(reads).split("|poll|")[1 : polls + 1]  # the poll running at the start is cut
    return [[read for read in chunk.split("\n") if read] for chunk in whole]


def test_console_reads_the_gateway_once_per_poll_when_it_serves_several_models(
    browser: Browser, many: GatewayProcess
) -> None:
    with console_page(browser, f"http://{many.http_url}") as console:
        console.page.add_init_script(COUNT_READS)
        console.open_link()
        expect(console.page.locator("article.model")).to_have_count(7)
        assert polls_after(console, 3) == [["/admin/console/models"]] * 3  # was 1 + 2 per model: 15 here

        console.page.get_by_role("link", name="Events").click()
        expect(console.page.locator("#events-table tbody tr").first).to_be_visible()
        assert polls_after(console, 2) == [["/admin/events"]] * 2  # was one per model
        console.page.get_by_label("Model", exact=True).select_option("mlp_c")
        expect(console.page.locator('#events-table tbody tr[data-model="mlp_c"]').first).to_be_visible()
        assert polls_after(console, 2) == [["/admin/models/mlp_c/events"]] * 2
        assert console.problems == []


def test_console_shows_every_model_when_one_has_no_version_routed(browser: Browser, many: GatewayProcess) -> None:
    """A model none of whose versions loads has no live figures (its own read answers 404): the page shows it first,
    not ready, and every other model as usual; it does not give up the whole update."""
    with console_page(browser, f"http://{many.http_url}") as console:
        console.open_link()
        expect(console.page.locator("article.model")).to_have_count(7)
        broken = console.model("broken")
        expect(console.page.locator("article.model").first).to_have_attribute("data-model", "broken")
        expect(broken.locator(".badge")).to_have_text("not ready")
        expect(broken.locator(".part.live")).to_contain_text("No figures: no version of it is routed yet.")
        expect(console.field("mlp_d", "stable")).to_have_text("v2")
        expect(console.page.locator("#trouble")).to_have_text("")
        assert console.problems == []
