"""Screenshots of the ops console for the README (``docs/ops-console-*.png``), taken from a real gateway serving the
example models under a light load: an activation's result, the models page with a canary and a shadow running, the
audit log, and the models page on a phone. Needs Debian's chromium and the ``[export,dev]`` extras.

Usage: ``python -m tests.console_screens [--repository model_repository] [--out docs]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from playwright.sync_api import Browser, Locator, Page, expect

from examples.export_examples import export_examples
from tests.console_support import DESKTOP, PHONE, TOKEN, BackgroundLoad, admin, chromium, console_page
from tests.gateway_process import GatewayProcess, gateway_on_copy

FIGURES_S = 14.0
"""How long the load runs before the models page is taken, so that its sparklines have a few points."""


def take(repository: Path, out: Path) -> list[Path]:
    export_examples(repository)  # the examples' versions 1 and 2 (kept when they exist)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="switchyard-screens-") as work, chromium() as browser, gateway_on_copy(
        repository, Path(work), token=TOKEN
    ) as gateway:
        admin(gateway.http_url, "POST", "models/classifier/versions/1/activate")
        # A light load: the figures of a calm evening, not of a saturated 2-core box.
        with BackgroundLoad(gateway.http_url, clients=4, pause_s=0.02) as classifier, BackgroundLoad(
            gateway.http_url, clients=4, pause_s=0.02, model="mlp"
        ) as mlp:
            written = _screens(browser, gateway, out)
        failed = len(classifier.failures()) + len(mlp.failures())
        print(f"load: {len(classifier.answers) + len(mlp.answers)} requests, {failed} failed")
    return written


def _screens(browser: Browser, gateway: GatewayProcess, out: Path) -> list[Path]:
    base = f"http://{gateway.http_url}"
    written = []
    with console_page(browser, base, DESKTOP) as console:
        console.signed_in()
        console.page.get_by_role("button", name="Activate version 2 of classifier").click()
        console.confirm()
        written.append(_shot(console.page.locator("#confirm"), out / "ops-console-activate.png"))
        console.close_dialog()
        admin(gateway.http_url, "PUT", "models/classifier/traffic", {"canary": 1, "weight": 20})
        admin(gateway.http_url, "PUT", "models/mlp/shadow", {"version": 1, "percent": 50})
        time.sleep(FIGURES_S)
        expect(console.field("classifier", "canary")).to_have_text("v1 at 20 %")
        console.page.mouse.move(0, 0)
        written.append(_page(console.page, out / "ops-console-models.png", full=True))
        console.page.get_by_role("link", name="Events").click()
        expect(console.page.locator("#events-table tbody tr").first).to_be_visible()
        written.append(_page(console.page, out / "ops-console-events.png", full=False))
        if console.foreign or console.problems:
            raise RuntimeError(f"the console left its origin or logged errors: {console.foreign} {console.problems}")
    with console_page(browser, base, PHONE) as phone:
        phone.signed_in()
        time.sleep(2.5)  # one poll: the figures of the page's first minute
        written.append(_page(phone.page, out / "ops-console-phone.png", full=False))
    return written


def _page(page: Page, path: Path, *, full: bool) -> Path:
    page.screenshot(path=str(path), full_page=full)
    return path


def _shot(locator: Locator, path: Path) -> Path:
    locator.screenshot(path=str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    for path in take(args.repository, args.out):
        print(path)


if __name__ == "__main__":
    main()
