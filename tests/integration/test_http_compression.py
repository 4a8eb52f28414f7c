"""Compressed HTTP bodies on the inference routes (issue #30): tritonclient's ``request_compression_algorithm`` and
``response_compression_algorithm`` (gzip, deflate) get the answers an uncompressed call gets, over the blocking and
the aio client; the answer's coding headers; the body limit held on the inflated bytes (a 1 MB gzip bomb is refused
with 413 while the gateway's memory stays flat, a body just within the limit passes); unsupported and corrupt
codings refused by name; gRPC's own compression (gzip, deflate). One gateway in its own process, so that its memory
can be read."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient

from examples import models
from services.gateway.tensors.types import Array
from tests.gateway_process import GatewayProcess, gateway_process
from tests.raw_http import exchange, reset_peak_rss, rss_kib


def _gzip(data: bytes) -> bytes:
    """gzip with a fixed mtime: parameters built from these bytes name the tests, and every xdist worker must
    collect the same names (the header's default mtime is the current second)."""
    return gzip.compress(data, mtime=0)


pytestmark = pytest.mark.slow  # a gateway process
TOKEN = "compression-token"
MIB = 1024 * 1024
LIMIT = 4 * MIB
"""The gateway's ``max_body_bytes``: above the 1 MB bomb, so that only its inflated size can pass the limit."""
ROWS = 32
"""Rows per request: answers well over the size below which the gateway does not compress."""
OUTPUTS = ("probabilities", "logits")
CODINGS = ("gzip", "deflate")


@pytest.fixture(scope="module")
def gateway(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("compression")
    with gateway_process(repository, work, token=TOKEN, max_body_bytes=str(LIMIT)) as running:
        yield running


@pytest.fixture(scope="module")
def features() -> Array:
    return models.mlp_inputs(ROWS, seed=11).numpy()


@pytest.fixture(scope="module")
def plain(gateway: GatewayProcess, features: Array) -> dict[bool, dict[str, Array]]:
    """The uncompressed answers, binary and JSON: what every compressed exchange must give."""
    return {binary: _infer(gateway, features, binary, None, None) for binary in (True, False)}


def _infer(
    gateway: GatewayProcess, features: Array, binary: bool, request: str | None, response: str | None
) -> dict[str, Array]:
    client = httpclient.InferenceServerClient(gateway.http_url)
    try:
        tensor = httpclient.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in OUTPUTS]
        result = client.infer(
            "mlp", [tensor], outputs=outputs,
            request_compression_algorithm=request, response_compression_algorithm=response,
        )  # fmt: skip
    finally:
        client.close()
    return {name: result.as_numpy(name) for name in OUTPUTS}


def _same(got: dict[str, Array], want: dict[str, Array]) -> None:
    for name in OUTPUTS:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize(("request_coding", "response_coding"), [(c, c) for c in CODINGS] + [("gzip", "deflate")])
def test_tritonclient_gets_the_uncompressed_answer_when_bodies_are_compressed(
    gateway: GatewayProcess,
    features: Array,
    plain: dict[bool, dict[str, Array]],
    binary: bool,
    request_coding: str,
    response_coding: str,
) -> None:
    _same(_infer(gateway, features, binary, request_coding, response_coding), plain[binary])


@pytest.mark.parametrize("coding", CODINGS)
async def test_aio_client_gets_the_uncompressed_answer_when_bodies_are_compressed(
    gateway: GatewayProcess, features: Array, plain: dict[bool, dict[str, Array]], coding: str
) -> None:
    async with aiohttpclient.InferenceServerClient(gateway.http_url) as client:
        tensor = aiohttpclient.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features)
        outputs = [aiohttpclient.InferRequestedOutput(name) for name in OUTPUTS]
        result = await client.infer(
            "mlp", [tensor], outputs=outputs, request_compression_algorithm=coding,
            response_compression_algorithm=coding,
        )  # fmt: skip
    _same({name: result.as_numpy(name) for name in OUTPUTS}, plain[True])


def _binary_request(features: Array) -> tuple[bytes, dict[str, str]]:
    head = json.dumps({
        "inputs": [{"name": "features", "shape": list(features.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": features.nbytes}}],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in OUTPUTS],
    }).encode()  # fmt: skip
    return head + features.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


@pytest.mark.parametrize("coding", CODINGS)
def test_binary_answer_is_compressed_whole_with_the_json_length_uncompressed_when_accept_encoding_asks(
    gateway: GatewayProcess, features: Array, coding: str
) -> None:
    body, headers = _binary_request(features)
    url = f"http://{gateway.http_url}/v2/models/mlp/infer"
    with httpx.Client() as client:
        identity = client.post(url, content=body, headers={**headers, "Accept-Encoding": "identity"})
        with client.stream("POST", url, content=body, headers={**headers, "Accept-Encoding": coding}) as coded:
            raw = b"".join(coded.iter_raw())
    assert identity.status_code == coded.status_code == 200, identity.text
    assert "content-encoding" not in identity.headers
    assert identity.headers["vary"] == coded.headers["vary"] == "accept-encoding"
    assert coded.headers["content-encoding"] == coding
    assert int(coded.headers["content-length"]) == len(raw) < len(identity.content)
    # tritonclient inflates the whole body, then splits it at the uncompressed JSON length (as Triton sends it).
    assert coded.headers["inference-header-content-length"] == identity.headers["inference-header-content-length"]
    assert (gzip.decompress(raw) if coding == "gzip" else zlib.decompress(raw)) == identity.content


@pytest.mark.parametrize(
    ("accept", "coding"),
    [("deflate;q=0.5, gzip;q=0.4", "deflate"), ("gzip;q=0, *", "deflate"), ("gzip;q=0.5, identity", None),
     ("*;q=0", None), ("br", None)],
)  # fmt: skip
def test_answer_coding_follows_q_values_when_accept_encoding_weighs_codings(
    gateway: GatewayProcess, features: Array, accept: str, coding: str | None
) -> None:
    body, headers = _binary_request(features)
    response = httpx.post(
        f"http://{gateway.http_url}/v2/models/mlp/infer", content=body, headers={**headers, "Accept-Encoding": accept}
    )
    assert response.status_code == 200, response.text
    assert response.headers.get("content-encoding") == coding


@pytest.mark.parametrize("coding", CODINGS)
def test_raw_deflate_and_gzip_members_are_read_when_clients_send_them(
    gateway: GatewayProcess, features: Array, coding: str
) -> None:
    body, headers = _binary_request(features)
    if coding == "gzip":  # two members one after the other, as `cat a.gz b.gz` makes
        coded = _gzip(body[:100]) + _gzip(body[100:])
    else:  # RFC 1951 without the zlib wrapper
        packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        coded = packer.compress(body) + packer.flush()
    url = f"http://{gateway.http_url}/v2/models/mlp/infer"
    response = httpx.post(url, content=coded, headers={**headers, "Content-Encoding": coding})
    expected = httpx.post(url, content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.content == expected.content


def test_unsupported_content_encoding_answers_415_naming_it_when_a_client_sends_brotli(gateway: GatewayProcess) -> None:
    response = httpx.post(
        f"http://{gateway.http_url}/v2/models/mlp/infer", content=b"\x00" * 64, headers={"Content-Encoding": "br"}
    )
    assert response.status_code == 415
    assert response.headers["accept-encoding"] == "gzip, deflate"  # RFC 7694, as Triton answers
    assert response.json()["error"] == "unsupported Content-Encoding 'br'; expected one of: gzip, deflate (or identity)"


@pytest.mark.parametrize(
    ("coding", "body", "expected"),
    [("gzip", b"not gzip at all", "not valid gzip data"), ("deflate", b"\x78\x9c\xff\xff", "not valid deflate data"),
     ("gzip", _gzip(b'{"inputs": []}')[:-6], "ends before its gzip data does")],
)  # fmt: skip
def test_corrupt_compressed_body_answers_400_naming_the_encoding_when_it_does_not_inflate(
    gateway: GatewayProcess, coding: str, body: bytes, expected: str
) -> None:
    response = httpx.post(
        f"http://{gateway.http_url}/v2/models/mlp/infer", content=body, headers={"Content-Encoding": coding}
    )
    assert response.status_code == 400
    assert expected in response.json()["error"]
    assert f"Content-Encoding: {coding}" in response.json()["error"]


def _padded(features: Array, size: int) -> bytes:
    """A JSON request of exactly ``size`` bytes: trailing whitespace is valid JSON."""
    data = json.dumps({"inputs": [{"name": "features", "shape": list(features.shape), "datatype": "FP32",
                                   "data": features.ravel().tolist()}]}).encode()  # fmt: skip
    return data + b" " * (size - len(data))


def test_compressed_body_passes_at_the_limit_and_answers_413_when_it_inflates_one_byte_past_it(
    gateway: GatewayProcess, features: Array
) -> None:
    url = f"http://{gateway.http_url}/v2/models/mlp/infer"
    within = httpx.post(url, content=_gzip(_padded(features, LIMIT)), headers={"Content-Encoding": "gzip"})
    over = httpx.post(url, content=_gzip(_padded(features, LIMIT + 1)), headers={"Content-Encoding": "gzip"})
    assert within.status_code == 200, within.text
    assert over.status_code == 413
    assert over.json()["error"] == f"decompressed request body exceeds the {LIMIT} byte limit (Content-Encoding: gzip)"


def _bomb() -> bytes:
    """About 1 MB of gzip that inflates to 1 GiB of zeros: sixteen members of 64 MiB each (RFC 1952 allows several;
    one member of 1 GiB takes seconds to compress)."""
    member = zlib.compress(bytes(64 * MIB), 9, wbits=16 + zlib.MAX_WBITS)
    return member * 16


def test_gzip_bomb_answers_413_with_flat_memory_when_it_would_inflate_to_a_gibibyte(gateway: GatewayProcess) -> None:
    assert gateway.process is not None
    pid = gateway.process.pid
    bomb = _bomb()
    assert MIB / 2 < len(bomb) < LIMIT  # the compressed size passes the limit's check: only inflating finds it
    head = (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb)
    )
    exchange(gateway.http_port, [_padded_request()], keep_open=True)  # the inference path has run once
    before = rss_kib(pid)
    reset_peak_rss(pid)
    answer = exchange(gateway.http_port, [head, *(bomb[at : at + 64 * 1024] for at in range(0, len(bomb), 64 * 1024))])
    peak = rss_kib(pid, "VmHWM")
    figures = f"{len(bomb)} bytes of gzip for 1 GiB; RSS {before / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB"
    print(figures)
    assert answer.status == 413, answer
    assert b"decompressed request body exceeds" in answer.body
    assert peak - before < 64 * 1024, figures  # the limit (4 MiB) and the compressed body, with room: not 1 GiB


def _padded_request() -> bytes:
    body = _padded(models.mlp_inputs(1, seed=1).numpy(), 2048)
    head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: gateway\r\nContent-Length: %d\r\n\r\n" % len(body)
    return head + body


@pytest.mark.parametrize("coding", CODINGS)
def test_grpc_client_gets_the_uncompressed_answer_when_it_compresses_its_messages(
    gateway: GatewayProcess, features: Array, plain: dict[bool, dict[str, Array]], coding: str
) -> None:
    client = grpcclient.InferenceServerClient(gateway.grpc_url)
    try:
        tensor = grpcclient.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features)
        outputs = [grpcclient.InferRequestedOutput(name) for name in OUTPUTS]
        result = client.infer("mlp", [tensor], outputs=outputs, compression_algorithm=coding)
    finally:
        client.close()
    _same({name: result.as_numpy(name) for name in OUTPUTS}, plain[True])
