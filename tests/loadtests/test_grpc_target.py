"""Where the locust gRPC users connect without ``--grpc-target`` (loadtests/grpc_target.py): the URL's host at the
port the gateway advertises, else at the HTTP port + 1, and each target names the rule that found it."""

from __future__ import annotations

import json

import pytest

from services.tritonlocal import free_port
from tests.locust_runs import loadtests_module

gt = loadtests_module("grpc_target")


def test_target_takes_the_advertised_port_when_the_gateway_names_one() -> None:
    body = json.dumps({"name": "switchyard", "version": "0.1.0", "extensions": [], "grpc_port": 54123}).encode()

    target = gt.advertised("http://127.0.0.1:54000", gt.read_grpc_port(body))

    assert target.address == "127.0.0.1:54123"
    assert target.rule == "the port the gateway advertises (grpc_port in GET http://127.0.0.1:54000/v2)"


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://127.0.0.1:54000", "127.0.0.1:54001"),
        ("http://gateway:8000/", "gateway:8001"),
        ("http://[::1]:9000", "[::1]:9001"),
        ("https://gateway.example", "gateway.example:8001"),  # no port in the URL: the gateway's default
    ],
)
def test_target_falls_back_to_the_http_port_plus_one_when_the_gateway_cannot_say(url: str, address: str) -> None:
    target = gt.offset(url, "why not")

    assert target.address == address
    assert target.rule.endswith("(why not)")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"name": "triton", "version": "2.51", "extensions": []}', "names no grpc_port"),
        (b'{"grpc_port": null}', "grpc_port None, expected a port number"),
        (b'{"grpc_port": true}', "grpc_port True, expected a port number from 1 to 65535"),
        (b'{"grpc_port": 70000}', "grpc_port 70000, expected a port number"),
        (b"[8001]", "answered list, expected a JSON object"),
        (b"<html>", "did not answer JSON"),
    ],
)
def test_reading_the_advertised_port_says_what_was_wrong_when_the_body_has_none(body: bytes, expected: str) -> None:
    with pytest.raises(ValueError, match="GET /v2") as caught:
        gt.read_grpc_port(body)
    assert expected in str(caught.value)


def test_resolve_uses_the_offset_and_says_why_when_nothing_answers_at_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused at once

    target = gt.resolve(url, "")

    assert target.address == f"127.0.0.1:{int(url.rsplit(':', 1)[1]) + 1}"
    assert target.rule.startswith(f"HTTP port + 1, the default offset (GET {url}/v2 failed: ")
    assert "refused" in target.rule


def test_resolve_keeps_the_given_target_and_asks_nothing_when_one_is_given() -> None:
    target = gt.resolve("http://127.0.0.1:1", "gateway:9001")

    assert (target.address, target.rule) == ("gateway:9001", "given by --grpc-target (GRPC_TARGET)")


def test_resolve_refuses_a_host_whose_port_is_not_a_port() -> None:
    with pytest.raises(ValueError, match=r"--host 'http://gateway:80000' has no valid port, expected http://HOST"):
        gt.resolve("http://gateway:80000", "")
