"""``switchyard replay``: send logged requests again to one version of a running gateway and compare its answers with
the logged ones. Exit 0 when every answer matched within the tolerances, 1 when one differs (in value or status),
2 when the call cannot run (a source that cannot be read, a gateway that cannot be reached or refuses the key, a
version it does not serve, no logged request that can be sent again): one ``error:`` line on stderr that says what
to fix.

The root command imports this to register it: typer and the standard library at module level; numpy, httpx,
tritonclient and the log readers only when the command runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    import httpx

    from services.inferlog.compare import Answer, ReplayReport

__all__ = ["register"]

EXIT_PASSED, EXIT_DIFFERS, EXIT_USAGE = 0, 1, 2
REQUEST_TIMEOUT_S = 60.0
BUSY = (429, 503)
"""The gateway's "not now" answers (rate limit, overload): waited out and sent again, never a mismatch."""
MOST_RETRIES = 5
LONGEST_WAIT_S = 30.0
"""A Retry-After beyond this is cut to it: a replay should not sit idle for minutes on one request."""
ACCESS_REFUSED = (401, 403)


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


def replay(
    source: Annotated[
        str,
        typer.Argument(
            help="The inference log: a directory (or file:///abs/dir) or redis://host:port/db?stream=NAME.",
            show_default=False,
        ),
    ],
    model: Annotated[str, typer.Option("--model", help="Replay this model's records.", show_default=False)],
    version: Annotated[
        int, typer.Option("--version", min=1, help="Send them to this version (pinned).", show_default=False)
    ],
    url: Annotated[str, typer.Option("--url", help="The gateway's HTTP address.")] = "http://127.0.0.1:8000",
    rate: Annotated[float, typer.Option("--rate", min=0, help="Requests per second (0: as fast as allowed).")] = 0.0,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Replay at most the first N records.", show_default=False)
    ] = None,
    atol: Annotated[float, typer.Option("--atol", min=0, help="Absolute tolerance per value.")] = 1e-5,
    rtol: Annotated[float, typer.Option("--rtol", min=0, help="Relative tolerance per value.")] = 1e-4,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", envvar="SWITCHYARD_API_KEY", help="Sent as X-API-Key.", show_default=False),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON (for scripts).")] = False,
) -> None:
    """Send logged requests again to VERSION and compare the answers with the logged ones."""
    import httpx

    from services.inferlog.compare import ReplayReport
    from services.inferlog.format import RecordError
    from services.inferlog.sources import SourceError, read_records, shown

    report = ReplayReport(model, version, atol, rtol, source=source)
    target = Target(url if "://" in url else f"http://{url}", model, version, api_key)
    try:
        records = read_records(source, model=model, limit=limit, warn=_warn)
        with httpx.Client(base_url=target.url, timeout=REQUEST_TIMEOUT_S) as http:
            _check_served(http, target)
            _run(http, target, records, report, rate)
    except (SourceError, RecordError) as exc:
        _fail(f"{exc}")
    except httpx.HTTPError as exc:
        _fail(f"cannot reach the gateway at {target.url}: {exc or type(exc).__name__} (is it running? set --url)")
    if report.records == 0:
        _fail(f"{shown(source)} holds no record of model '{model}'; check --model and the source")
    if report.sent == 0:  # nothing was compared, so nothing differed: the replay could not run
        _fail(report.none_sent())
    _print(report, as_json)
    raise typer.Exit(EXIT_PASSED if report.passed else EXIT_DIFFERS)


REPLAY_HEADER = "X-Switchyard-Replay"


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    version: int
    api_key: str | None

    @property
    def headers(self) -> dict[str, str]:
        """``X-Switchyard-Replay``: the gateway does not log a replayed request in its inference log (it is there
        already, and a later replay would send it twice)."""
        marker = {REPLAY_HEADER: "1"}
        return {"X-API-Key": self.api_key, **marker} if self.api_key else marker

    @property
    def path(self) -> str:
        from urllib.parse import quote

        return f"/v2/models/{quote(self.model, safe='')}/versions/{self.version}"


def _check_served(http: httpx.Client, target: Target) -> None:
    """A version the gateway does not serve would make every answer a 404 "mismatch": say so once instead, with the
    gateway's reason, and what to do: load the version, or name a model the gateway has."""
    answer = http.get(f"{target.path}/ready", headers=target.headers)
    if answer.status_code in ACCESS_REFUSED:
        _fail(f"the gateway refused the API key ({answer.status_code}): give a valid one with --api-key")
    if answer.status_code != 200:
        model_path = target.path.rsplit("/versions/", 1)[0]
        known = http.get(model_path, headers=target.headers).status_code == 200
        hint = (
            f"load it first: switchyard models load {target.model} {target.version}" if known
            else f"the gateway serves no model '{target.model}': check --model and --url"
        )
        _fail(
            f"model '{target.model}' version {target.version} is not ready at {target.url} "
            f"({answer.status_code}: {_error_text(answer)}); {hint}"
        )


def _run(
    http: httpx.Client, target: Target, records: Iterator[dict[str, Any]], report: ReplayReport, rate: float
) -> None:
    from services.inferlog.compare import resendable

    started = time.monotonic()
    sent = 0
    for record in records:
        why_not = resendable(record)
        if why_not is not None:
            report.skip(why_not)
            continue
        if rate > 0:  # the n-th request leaves no earlier than n / rate seconds after the first
            time.sleep(max(0.0, started + sent / rate - time.monotonic()))
        sent += 1
        report.add(record, _send(http, target, record))


def _send(http: httpx.Client, target: Target, record: dict[str, Any]) -> Answer:
    """One logged request, pinned to the version; a 429 or 503 is sent again after its Retry-After (bounded)."""
    from services.inferlog.compare import Answer

    body, json_size = _request_body(record)
    headers = {**target.headers, "Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    for attempt in range(MOST_RETRIES + 1):
        began = time.perf_counter()
        response = http.post(f"{target.path}/infer", content=body, headers=headers)
        latency_ms = (time.perf_counter() - began) * 1000
        if response.status_code not in BUSY or attempt == MOST_RETRIES:
            break
        time.sleep(_retry_after(response))
    if response.status_code in ACCESS_REFUSED:
        _fail(f"the gateway refused the API key ({response.status_code}): give a valid one with --api-key")
    if response.status_code != 200:
        return Answer(response.status_code, {}, latency_ms, _error_text(response))
    return Answer(200, _outputs(response), latency_ms)


def _request_body(record: dict[str, Any]) -> tuple[bytes, int | None]:
    """The logged request as v2 binary framing (the body, the JSON header's length): its inputs, the outputs it named
    and, as it sent them, its request parameters and each output's parameters (a class count answers other tensors
    than the raw output; a timeout or a parameter the model refuses another status). tritonclient frames the tensors;
    the parameters go into its JSON header as logged, since it refuses some names (``sequence_id``, ``triton_...``)
    as custom parameters that a request may still have carried."""
    import json

    import tritonclient.http as triton

    from services.inferlog.format import inputs_of, output_parameters_of, parameters_of

    inputs = []
    for name, datatype, array in inputs_of(record):
        tensor = triton.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    names = record["request"].get("outputs")
    outputs = [triton.InferRequestedOutput(name, binary_data=True) for name in names] if names else None
    body, json_size = triton.InferenceServerClient.generate_request_body(inputs, outputs, request_id=str(record["id"]))
    parameters, asked = parameters_of(record), output_parameters_of(record)
    if not parameters and not asked:  # a plain request, and every record older gateways wrote
        return body, json_size
    end = len(body) if json_size is None else json_size
    head = json.loads(body[:end])
    if parameters:
        head["parameters"] = {**head.get("parameters", {}), **parameters}
    for output in head.get("outputs", []):
        output["parameters"] = {**output.get("parameters", {}), **asked.get(output["name"], {})}
    encoded = json.dumps(head).encode()
    return encoded + body[end:], None if json_size is None else len(encoded)


def _outputs(response: httpx.Response) -> dict[str, Any]:
    import tritonclient.http as triton

    header = response.headers.get("Inference-Header-Content-Length")
    result = triton.InferResult.from_response_body(
        response.content, header_length=int(header) if header is not None else None
    )
    names = [output["name"] for output in result.get_response().get("outputs", [])]
    return {name: result.as_numpy(name) for name in names}


def _retry_after(response: httpx.Response) -> float:
    try:
        seconds = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), LONGEST_WAIT_S)


def _error_text(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:200]
    return str(data.get("error")) if isinstance(data, dict) else response.text[:200]


def _print(report: ReplayReport, as_json: bool) -> None:
    if as_json:
        import json

        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        typer.echo(report.render())


def _warn(message: str) -> None:
    typer.echo(f"warning: {message}", err=True)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(EXIT_USAGE)
