"""``switchyard models traffic`` and ``switchyard models shadow`` against a real gateway on a real port: a sticky
canary split with rollback bounds set from the command line and seen by ``status`` and ``list``, requests of one
session landing on one side, shadowing set and cleared, the gateway's refusals as one ``error:`` line (exit 1),
options that do not go together as a usage error (exit 2), and ``--json`` for scripts."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from services.gateway.settings import Settings
from services.ops.models_views import status_view
from tests.cli_support import FEATURES, TOKEN, cells, models, one_error_line, squeezed
from tests.gateway_harness import RunningGateway, running_gateway

pytestmark = pytest.mark.slow  # a gateway on real ports

ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def gateway(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """A private copy of ``mlp`` (versions 1 and 2 loaded, 2 stable), shared by the module's tests: each one leaves
    it without a canary or a shadow (see ``no_policies``)."""
    folder = tmp_path_factory.mktemp("traffic_cli")
    shutil.copytree(repository / "mlp", folder / "mlp")
    settings = Settings(repository=folder, port=0, grpc_port=0, admin_token=TOKEN, repository_poll_s=0)  # type: ignore[arg-type]
    with running_gateway(settings) as running:
        yield running


@pytest.fixture(autouse=True)
def no_policies(gateway: RunningGateway) -> Iterator[None]:
    yield
    for policy, clear in (("traffic", {"canary": None}), ("shadow", {"version": None})):
        response = httpx.put(f"http://{gateway.http_url}/admin/models/mlp/{policy}", json=clear, headers=ADMIN)
        assert response.status_code == 200, response.text










def served(gateway: RunningGateway, headers: Mapping[str, str] | None = None) -> int:
    response = httpx.post(
        f"http://{gateway.http_url}/v2/models/mlp/infer", json={"inputs": [FEATURES]}, headers=headers
    )
    assert response.status_code == 200, response.text
    return int(response.headers["X-Model-Version"])


def routing(gateway: RunningGateway) -> dict[str, object]:
    response = httpx.get(f"http://{gateway.http_url}/admin/models/mlp", headers=ADMIN)
    assert response.status_code == 200, response.text
    record: dict[str, object] = response.json()["routing"]
    return record


# -- canary ---------------------------------------------------------------------------------------------------
def test_traffic_sets_a_sticky_canary_that_status_and_list_show_when_given_with_bounds(
    gateway: RunningGateway,
) -> None:
    # A latency bound no noisy neighbour breaks: the canary must not be pulled back while sessions are counted.
    bounds = ["--max-error-rate", "0.05", "--max-p99-ratio", "1000", "--window", "20", "--min-requests", "10"]
    options = ["--canary", "1", "--weight", "30", "--sticky-header", "X-Session-Id", *bounds, "--promote-after", "3600"]
    result = models(gateway, "traffic", "mlp", *options)
    assert result.exit_code == 0, result.output
    out = squeezed(result.stdout)
    assert "traffic mlp: canary 1 @ 30%: ok" in out
    assert "flip" in out
    assert "routing stable 2, previous none, generation" in out
    assert "canary version 1 at 30% of unversioned requests, sticky by header x-session-id, since" in out
    assert (
        "rollback when its 5xx rate > 5% or its p99 > 1000× the stable version's over the last 20 s "
        "(judged once the canary has 10 requests in it)"
    ) in out
    assert "promotion after 3600 s without a broken bound (at" in out

    sides = {f"s{n}": {served(gateway, {"X-Session-Id": f"s{n}"}) for _ in range(3)} for n in range(16)}
    assert all(len(versions) == 1 for versions in sides.values()), sides
    counts: Counter[int] = Counter()
    for (version,) in sides.values():
        counts[version] += 3

    status = models(gateway, "status", "mlp")
    assert status.exit_code == 0, status.output
    assert "canary version 1 at 30% of unversioned requests, sticky by header x-session-id" in squeezed(status.stdout)
    assert "live window: the last 20 s" in status.stdout
    assert cells(status.stdout, "stable")[1:5] == ["2", str(counts[2]), "0", "0%"]
    assert cells(status.stdout, "canary")[1:5] == ["1", str(counts[1]), "0", "0%"]
    assert "shadow none" in squeezed(status.stdout)

    listed = models(gateway, "list")
    assert listed.exit_code == 0, listed.output
    assert cells(listed.stdout, "mlp")[-1] == "canary 1 @ 30%"

    cleared = models(gateway, "traffic", "mlp", "--clear")
    assert cleared.exit_code == 0, cleared.output
    assert "traffic mlp: canary cleared: ok" in cleared.stdout
    assert "canary none" in squeezed(cleared.stdout)
    assert routing(gateway)["canary"] is None
    assert {served(gateway, {"X-Session-Id": session}) for session in sides} == {2}
    assert "canary / shadow" not in models(gateway, "list").stdout
    audit = models(gateway, "events", "mlp", "--limit", "2")
    rows = [[cell.strip() for cell in line.split("│")[2:5]] for line in audit.stdout.splitlines() if "token:" in line]
    assert rows == [["traffic", "canary 1 @ 30%", "ok"], ["traffic", "canary cleared", "ok"]]


def test_status_says_why_when_the_gateway_pulled_the_canary_back(gateway: RunningGateway) -> None:
    assert models(gateway, "traffic", "mlp", "--canary", "1", "--weight", "10").exit_code == 0
    status = json.loads(models(gateway, "status", "mlp", "--json").stdout)
    # What the gateway's watch sets when a bound breaks: the weight to 0, and why.
    why = "canary 5xx rate 40.0% over 60 requests is above 5.0% (stable: 0.0% over 140)"
    status["traffic"]["canary"] |= {"weight": 0.0, "rolled_back": why}
    console = Console(width=200, record=True)
    console.print(status_view(status))
    text = squeezed(console.export_text())
    assert "canary version 1 at 0% of unversioned requests, request by request" in text
    assert f"pulled back: {why}" in text
    assert "rollback none: the gateway never pulls this canary back by itself" in text


# -- shadow ---------------------------------------------------------------------------------------------------
def test_shadow_sets_and_clears_a_shadow_version_that_status_and_list_show(gateway: RunningGateway) -> None:
    result = models(gateway, "shadow", "mlp", "--version", "1", "--percent", "50")
    assert result.exit_code == 0, result.output
    assert "shadow mlp: shadow 1 @ 50%: ok" in result.stdout
    assert "shadow version 1 on 50% of unversioned requests" in squeezed(result.stdout)
    assert routing(gateway)["shadow"] == {"version": 1, "sample": 0.5}  # the state keeps the fraction
    assert {served(gateway) for _ in range(4)} == {2}

    status = models(gateway, "status", "mlp")
    assert "shadow version 1 on 50% of unversioned requests" in squeezed(status.stdout)
    assert "canary none" in squeezed(status.stdout)
    assert "last action shadow shadow 1 @ 50%: ok" in squeezed(status.stdout)
    assert cells(models(gateway, "list").stdout, "mlp")[-1] == "shadow 1 @ 50%"

    cleared = models(gateway, "shadow", "mlp", "--clear")
    assert cleared.exit_code == 0, cleared.output
    assert "shadow mlp: shadow cleared: ok" in cleared.stdout
    assert "shadow none" in squeezed(models(gateway, "status", "mlp").stdout)


# -- failing --------------------------------------------------------------------------------------------------
def test_traffic_and_shadow_exit_1_with_the_server_message_when_the_gateway_refuses_the_policy(
    gateway: RunningGateway,
) -> None:
    generation = routing(gateway)["generation"]
    heavy = models(gateway, "traffic", "mlp", "--canary", "1", "--weight", "150")
    assert heavy.exit_code == 1
    assert one_error_line(heavy) == "error: 'weight' must be a number from 0 to 100, got 150"
    stable = models(gateway, "traffic", "mlp", "--canary", "2", "--weight", "20")
    assert stable.exit_code == 1
    assert one_error_line(stable) == "error: version 2 is the stable version of model 'mlp'; pick another"
    missing = models(gateway, "traffic", "mlp", "--canary", "9", "--weight", "20")
    assert missing.exit_code == 1
    assert "failed at step 'load': Request for unknown model: 'mlp' version 9 is not found" in one_error_line(missing)
    share = models(gateway, "shadow", "mlp", "--version", "1", "--percent", "200")
    assert share.exit_code == 1
    assert one_error_line(share) == "error: 'percent' must be a number from 0 to 100, got 200"
    assert routing(gateway)["generation"] == generation


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["traffic", "mlp", "--clear", "--canary", "1"], "leave out --canary"),
        (["traffic", "mlp", "--canary", "1"], "give both --canary and --weight"),
        (["traffic", "mlp", "--canary", "1", "--weight", "5", "--window", "9"], "--max-error-rate and/or"),
        (["shadow", "mlp", "--clear", "--percent", "50"], "leave out --percent"),
        (["shadow", "mlp"], "give both --version and --percent"),
        (["shadow", "mlp", "--version", "1", "--percent", "5", "--sample", "0.05"], "give --percent alone"),
    ],
)
def test_traffic_and_shadow_exit_2_sending_nothing_when_the_options_do_not_go_together(
    gateway: RunningGateway, args: list[str], says: str
) -> None:
    generation = routing(gateway)["generation"]
    result = models(gateway, *args)
    assert result.exit_code == 2
    assert says in " ".join(result.stderr.replace("│", " ").split())
    assert result.stdout == ""
    assert routing(gateway)["generation"] == generation


# -- scripts --------------------------------------------------------------------------------------------------
def test_traffic_and_shadow_answer_json_sending_only_the_options_given_when_asked_with_json(
    gateway: RunningGateway,
) -> None:
    report = json.loads(models(gateway, "traffic", "mlp", "--canary", "1", "--weight", "20", "--json").stdout)
    assert (report["action"], report["result"]) == ("traffic", "ok")
    canary = report["routing"]["canary"]
    assert (canary["version"], canary["weight"], canary["sticky_header"]) == (1, 20.0, None)
    assert (canary["rollback"], canary["promote_after_s"]) == (None, None)
    bounded = models(gateway, "traffic", "mlp", "--canary", "1", "--weight", "20", "--max-p99-ratio", "2", "--json")
    assert json.loads(bounded.stdout)["routing"]["canary"]["rollback"] == {
        "max_error_rate": None,
        "max_p99_ratio": 2.0,
        "window_s": 30.0,
        "min_requests": 50,
    }
    status = json.loads(models(gateway, "status", "mlp", "--json").stdout)
    assert set(status["traffic"]["canary"]["window"]) == {"seconds", "stable", "canary"}
    deprecated = models(gateway, "shadow", "mlp", "--version", "1", "--sample", "0.25", "--json")
    assert "--sample is deprecated; --sample 0.25 is --percent 25" in deprecated.stderr
    shadow = json.loads(deprecated.stdout)
    assert shadow["routing"]["shadow"] == {"version": 1, "sample": 0.25, "percent": 25.0}
    cleared = json.loads(models(gateway, "traffic", "mlp", "--clear", "--json").stdout)
    assert (cleared["routing"]["canary"], cleared["routing"]["shadow"]["percent"]) == (None, 25.0)
