"""The gateway reaching the local Triton over mutual TLS (Triton's ``--grpc-use-ssl-mutual``): its model loads and
answers through the gateway, while a client without the gateway's certificate is refused by Triton; a renewed client
certificate is taken up without a restart, an expired one refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from services.gateway.settings import Settings
from services.tritonlocal import LocalTriton, TritonInstall, derive_config
from services.tritonlocal.server import TritonGrpcTls
from tests.gateway_harness import running_gateway
from tests.tls.certificates import Authority, Issued, days, make_authority, not_after_of, validity
from tests.triton.support import gateway_settings
from tests.tritonlocal.support import require_install
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ECHO_CONFIG = """
name: "echo"
platform: "onnxruntime_onnx"
max_batch_size: 4
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
"""


def write_echo(repository: Path) -> Path:
    """An FP32 identity, written by hand: enough to prove a request went to Triton and back."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "echo",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repository / "echo" / "1").mkdir(parents=True)
    onnx.save(model, repository / "echo" / "1" / "model.onnx")
    (repository / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    return repository


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_authority(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def triton(ca: Authority, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    install: TritonInstall = require_install()
    work = tmp_path_factory.mktemp("triton")
    server = ca.issue(ca.cert_file.parent, "triton", server=True)
    tls = TritonGrpcTls(server.cert_file, server.key_file, client_ca_file=ca.cert_file)
    repository = write_echo(work / "model_repository")
    with LocalTriton(repository, derived=work / "derived", install=install, log_file=work / "tritonserver.log",
                     grpc_tls=tls) as running:
        yield running


def test_triton_refuses_a_grpc_client_without_the_client_certificate(triton: LocalTriton, ca: Authority) -> None:
    with grpcclient.InferenceServerClient(triton.grpc_url, ssl=True, root_certificates=str(ca.cert_file)) as client,\
            pytest.raises(InferenceServerException):
        client.is_server_live(client_timeout=5.0)


def mutual_tls_settings(triton: LocalTriton, ca: Authority, client_certificate: Issued) -> Settings:
    return gateway_settings(
        triton.grpc_url, triton.source, triton_tls=True, triton_tls_ca_file=ca.cert_file,
        triton_tls_cert_file=client_certificate.cert_file, triton_tls_key_file=client_certificate.key_file,
    )


def echo_request(values: np.ndarray) -> httpclient.InferInput:
    request = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    request.set_data_from_numpy(values)
    return request


def test_the_gateway_serves_a_triton_model_over_mutual_tls(triton: LocalTriton, ca: Authority) -> None:
    settings = mutual_tls_settings(triton, ca, ca.issue(ca.cert_file.parent, "gateway", server=False))
    values = np.arange(8, dtype=np.float32).reshape(2, 4)
    with running_gateway(settings, config_transform=derive_config) as gateway:
        client = httpclient.InferenceServerClient(gateway.http_url)
        answer = client.infer("echo", [echo_request(values)]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(answer, values)


def test_a_client_certificate_renewed_on_disk_reaches_triton_without_a_restart(
    triton: LocalTriton, ca: Authority, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway starts with a client certificate Triton does not trust (another CA's: as good as an expired
    one); the deployment writes a trusted one over it, and within the probe's next ticks the gateway connects
    with it, loads the model and serves, with no restart. A key that does not match is then refused with a log
    line, and the connection keeps the certificate that works."""
    stranger = make_authority(tmp_path, name="other-ca")
    client_files = tmp_path / "client"
    client_files.mkdir()
    refused = stranger.issue(client_files, "gateway", server=False)
    values = np.arange(4, dtype=np.float32).reshape(1, 4)
    with running_gateway(mutual_tls_settings(triton, ca, refused), config_transform=derive_config) as gateway:
        client = httpclient.InferenceServerClient(gateway.http_url)
        request = echo_request(values)
        with pytest.raises(InferenceServerException):  # Triton refuses the handshake: nothing is loaded
            client.infer("echo", [request])

        renewed = ca.issue(client_files, "gateway", server=False)  # the same two paths, replaced
        assert renewed.cert_file == refused.cert_file

        answers: list[Any] = []
        assert wait_until(lambda: _answered(client, request, answers), timeout_s=30, interval_s=0.2)
        np.testing.assert_array_equal(answers[0].as_numpy("OUTPUT0"), values)

        stranger.issue(tmp_path, "unrelated", server=False).key_file.replace(renewed.key_file)
        assert wait_until(lambda: "TLS to Triton not reloaded" in caplog.text, timeout_s=10)
        assert "does not hold the private key of the certificate in SWITCHYARD_TRITON_TLS_CERT_FILE" in caplog.text
        np.testing.assert_array_equal(client.infer("echo", [request]).as_numpy("OUTPUT0"), values)


def _answered(client: httpclient.InferenceServerClient, request: httpclient.InferInput, into: list[Any]) -> bool:
    try:
        into.append(client.infer("echo", [request]))
    except InferenceServerException:
        return False
    return True


def test_an_expired_client_certificate_written_over_the_one_in_use_is_refused_and_triton_still_answers(
    triton: LocalTriton, ca: Authority, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stale client certificate written over the one the gateway connects with: Triton would refuse it, so the
    connections keep the one that works, the log says why, and the gauge goes on showing the one in use."""
    client_files = tmp_path / "client"
    client_files.mkdir()
    good = ca.issue(client_files, "gateway", server=False)
    in_use = {"setting": "triton_tls_cert_file", "subject": "CN=gateway", "serial": f"{good.serial:x}"}
    served_until = not_after_of(good.cert_file)
    values = np.arange(4, dtype=np.float32).reshape(1, 4)
    with running_gateway(mutual_tls_settings(triton, ca, good), config_transform=derive_config) as gateway:
        client = httpclient.InferenceServerClient(gateway.http_url)
        request = echo_request(values)
        np.testing.assert_array_equal(client.infer("echo", [request]).as_numpy("OUTPUT0"), values)
        assert gateway.registry.get_sample_value(EXPIRY, in_use) == served_until

        ca.issue(client_files, "gateway", server=False, valid=validity(starts=-days(90), ends=-days(1)))
        assert wait_until(lambda: "TLS to Triton not reloaded" in caplog.text, timeout_s=10)
        assert (f"SWITCHYARD_TRITON_TLS_CERT_FILE ({good.cert_file}) holds a certificate (CN=gateway) that expired at"
                in caplog.text)
        np.testing.assert_array_equal(client.infer("echo", [request]).as_numpy("OUTPUT0"), values)
        assert gateway.registry.get_sample_value(EXPIRY, in_use) == served_until


EXPIRY = "switchyard_tls_certificate_expiry_timestamp_seconds"
