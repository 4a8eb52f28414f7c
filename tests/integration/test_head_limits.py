"""Limits on the request head, before anything checks who the client is (issue #28, finding 2): a gateway in its own
process, probed with raw sockets, answers 431 and closes as soon as a head crosses ``max_header_bytes``,
``max_header_line_bytes`` or ``max_header_count`` (in one read or over many), serves heads just within them, keeps
its memory flat under four connections sending 1 MB header lines, and gRPC refuses metadata over the same limit."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from services.gateway.settings import Settings
from tests.foreign_repository import addsub_repository_at
from tests.gateway_process import GatewayProcess, gateway_process
from tests.raw_http import RawAnswer, exchange, reset_peak_rss, rss_kib

pytestmark = pytest.mark.slow
TOKEN = "head-limits-token"
LIMITS = Settings()
MAX_HEAD, MAX_LINE, MAX_COUNT = LIMITS.max_header_bytes, LIMITS.max_header_line_bytes, LIMITS.max_header_count
MIB = 1024 * 1024
PIECE = 64 * 1024
FLOOD_LINES, FLOOD_LINE_BYTES, FLOOD_CONNECTIONS = 200, MIB, 4


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("head-limits")
    with gateway_process(addsub_repository_at(work / "repository"), work, token=TOKEN) as running:
        yield running


def _body() -> bytes:
    inputs = [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))} for n in ("INPUT0", "INPUT1")]
    return json.dumps({"inputs": inputs}).encode()


def _request(headers: list[tuple[str, str]], target: str = "/v2/models/addsub/infer") -> bytes:
    """An inference request with ``headers`` after Host, Content-Type and Content-Length (three header lines)."""
    body = _body()
    lines = [f"POST {target} HTTP/1.1", "Host: gateway", "Content-Type: application/json",
             f"Content-Length: {len(body)}", *(f"{name}: {value}" for name, value in headers)]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _pieces(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _flood() -> Iterator[bytes]:
    """The probe's attack: a request head of ``FLOOD_LINES`` header lines of 1 MB each, written 64 KiB at a time."""
    yield b"POST /v2/models/addsub/infer HTTP/1.1\r\nHost: gateway\r\n"
    for line in range(FLOOD_LINES):
        yield f"X-Pad-{line}: ".encode()
        for _ in range(FLOOD_LINE_BYTES // PIECE):
            yield b"a" * PIECE
        yield b"\r\n"


def _refused(answer: RawAnswer, limit: str) -> None:
    assert answer.status == 431, answer
    assert answer.closed, answer
    assert limit in json.loads(answer.body)["error"], answer


def test_gateway_answers_431_and_closes_when_head_exceeds_max_header_bytes_in_one_read(
    gateway: GatewayProcess,
) -> None:
    headers = [(f"X-Pad-{n}", "a" * (MAX_LINE - 100)) for n in range(MAX_HEAD // (MAX_LINE - 100) + 1)]
    _refused(exchange(gateway.http_port, [_request(headers)]), f"max_header_bytes={MAX_HEAD}")


def test_gateway_answers_431_before_the_head_ends_when_one_line_keeps_coming(gateway: GatewayProcess) -> None:
    answer = exchange(gateway.http_port, _flood())
    _refused(answer, f"max_header_bytes={MAX_HEAD}")
    # Refused while the head was still coming: the client wrote a small part of the 200 MB (what the sockets'
    # buffers took before the gateway's answer could be seen), not all of it.
    assert answer.sent < 32 * MIB, answer.sent


def test_gateway_answers_431_when_one_header_line_exceeds_max_header_line_bytes(gateway: GatewayProcess) -> None:
    answer = exchange(gateway.http_port, [_request([("X-Long", "a" * MAX_LINE)])])
    _refused(answer, f"max_header_line_bytes={MAX_LINE}")


def test_gateway_answers_431_when_url_exceeds_max_header_line_bytes(gateway: GatewayProcess) -> None:
    target = "/v2/models/addsub/infer?pad=" + "a" * MAX_LINE
    _refused(exchange(gateway.http_port, [_request([], target)]), f"max_header_line_bytes={MAX_LINE}")


def test_gateway_answers_431_when_headers_exceed_max_header_count(gateway: GatewayProcess) -> None:
    headers = [(f"X-Many-{n}", "1") for n in range(MAX_COUNT - 3 + 1)]  # three lines _request writes itself
    _refused(exchange(gateway.http_port, [_request(headers)]), f"max_header_count={MAX_COUNT}")


def test_gateway_serves_head_just_within_every_limit_when_it_arrives_in_small_reads(gateway: GatewayProcess) -> None:
    longest = ("X-Longest", "a" * (MAX_LINE - len("X-Longest")))  # name and value make the line's size
    names = [f"X-Fill-{n:02}" for n in range(MAX_COUNT - 3 - 1)]
    spare = MAX_HEAD - 512 - len(_request([longest, *((name, "") for name in names)]).partition(b"\r\n\r\n")[0])
    request = _request([longest, *((name, "b" * (spare // len(names))) for name in names)])
    head = request.partition(b"\r\n\r\n")[0]
    assert MAX_HEAD - 2048 < len(head) < MAX_HEAD  # just within, with the request line and CRLFs counted
    for _ in range(2):  # the second request on the kept-alive connection is measured afresh
        answer = exchange(gateway.http_port, _pieces(request, 1024), keep_open=True)
        assert answer.status == 200, answer
        assert not answer.closed, answer
        assert json.loads(answer.body)["outputs"][0]["data"] == [2 * n for n in range(16)]


def test_gateway_memory_stays_flat_when_connections_flood_header_lines(gateway: GatewayProcess) -> None:
    assert gateway.process is not None
    pid = gateway.process.pid
    exchange(gateway.http_port, [_request([])], keep_open=True)  # the request path has run once
    before = rss_kib(pid)
    reset_peak_rss(pid)
    answers: list[RawAnswer] = []

    def flood() -> None:
        answers.append(exchange(gateway.http_port, _flood()))

    threads = [threading.Thread(target=flood) for _ in range(FLOOD_CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    peak = rss_kib(pid, "VmHWM")
    figures = (
        f"{FLOOD_CONNECTIONS} connections x {FLOOD_LINES} header lines of {FLOOD_LINE_BYTES} bytes: answers "
        f"{sorted(answer.status or 0 for answer in answers)}, {sum(a.sent for a in answers) / MIB:.1f} MiB sent; "
        f"RSS {before / 1024:.1f} MiB, peak during the flood {peak / 1024:.1f} MiB"
    )
    print(figures)
    assert [answer.status for answer in answers] == [431] * FLOOD_CONNECTIONS, figures
    assert peak - before < 4 * 1024, figures
    assert exchange(gateway.http_port, [_request([])], keep_open=True).status == 200


def test_grpc_refuses_call_when_metadata_exceed_max_header_bytes(gateway: GatewayProcess) -> None:
    message = service_pb2.ModelInferRequest(model_name="addsub")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(bytes(64))
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        # Twice gRPC's own default limit (16 KiB), within the setting's: served.
        within = [("x-pad", "a" * (MAX_HEAD // 2))]
        assert stub.ModelInfer(message, metadata=within, timeout=30).model_name == "addsub"
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(message, metadata=[("x-pad", "a" * (MAX_HEAD + 1))], timeout=30)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        assert stub.ModelInfer(message, timeout=30).model_name == "addsub"


def test_gateway_process_is_alive_when_every_refusal_was_answered(gateway: GatewayProcess) -> None:
    assert gateway.process is not None
    assert gateway.process.poll() is None
    assert "Traceback" not in Path(gateway.log).read_text()
