"""TLS and mutual TLS on the gateway's HTTP and gRPC listeners, with tritonclient, and a certificate replaced on
disk served to the next connection without a restart (an expired one refused, the one served on /metrics). One
gateway (empty repository) for the module."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.gateway_process import gateway_process
from tests.tls.certificates import Authority, Issued, days, make_authority, not_after_of, serial_of, validity
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

REFUSED = (ssl.SSLError, OSError, http.client.HTTPException)
"""How a refused handshake reaches an HTTP client: a TLS alert, or (TLS 1.3, where the server checks the client's
certificate after the client thinks the handshake done) the connection closed before an answer."""


@dataclass(frozen=True)
class Pki:
    folder: Path
    ca: Authority
    server: Issued
    client: Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("tls")
    ca = make_authority(folder)
    return Pki(folder, ca, ca.issue(folder, "server", server=True), ca.issue(folder, "client", server=False))


@pytest.fixture(scope="module")
def gateway(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    settings = Settings(
        repository=tmp_path_factory.mktemp("empty_repository"), port=0, grpc_port=0,
        tls_cert_file=pki.server.cert_file, tls_key_file=pki.server.key_file, tls_client_ca_file=pki.ca.cert_file,
    )  # tls_client_auth unset: "required", since a client CA is given
    with running_gateway(settings) as running:
        yield running


def http_client(gateway: RunningGateway, pki: Pki, *, with_certificate: bool) -> httpclient.InferenceServerClient:
    options = {"ca_certs": str(pki.ca.cert_file)}
    if with_certificate:
        options |= {"certfile": str(pki.client.cert_file), "keyfile": str(pki.client.key_file)}
    return httpclient.InferenceServerClient(gateway.http_url, ssl=True, ssl_options=options, connection_timeout=5.0)


def grpc_client(gateway: RunningGateway, pki: Pki, *, with_certificate: bool) -> grpcclient.InferenceServerClient:
    client_files = {"private_key": str(pki.client.key_file), "certificate_chain": str(pki.client.cert_file)}
    roots = str(pki.ca.cert_file)
    return grpcclient.InferenceServerClient(
        gateway.grpc_url, ssl=True, root_certificates=roots, **(client_files if with_certificate else {})
    )


def test_a_client_with_a_certificate_is_served_over_both_protocols(gateway: RunningGateway, pki: Pki) -> None:
    assert http_client(gateway, pki, with_certificate=True).get_server_metadata()["name"] == "switchyard"
    with grpc_client(gateway, pki, with_certificate=True) as client:
        assert client.get_server_metadata().name == "switchyard"


def test_a_client_without_a_certificate_is_refused_over_both_protocols(gateway: RunningGateway, pki: Pki) -> None:
    with pytest.raises(REFUSED):
        http_client(gateway, pki, with_certificate=False).is_server_live()
    with grpc_client(gateway, pki, with_certificate=False) as client, pytest.raises(InferenceServerException):
        client.is_server_live(client_timeout=5.0)


def test_plain_http_is_not_served(gateway: RunningGateway) -> None:
    with pytest.raises(REFUSED):
        httpclient.InferenceServerClient(gateway.http_url, connection_timeout=5.0).is_server_live()


def test_a_certificate_replaced_on_disk_is_what_the_next_connection_sees(gateway: RunningGateway, pki: Pki) -> None:
    ports = {"http": gateway.http_port, "grpc": gateway.grpc_port}
    assert {name: served_serial(port, pki) for name, port in ports.items()} == dict.fromkeys(ports, pki.server.serial)
    with open_connection(gateway.http_port, pki) as kept:
        renewed = pki.ca.issue(pki.folder, "server", server=True)  # a new key and serial, same file names
        assert renewed.serial != pki.server.serial
        assert until_served(gateway.http_port, pki, renewed.serial) == renewed.serial  # reloaded within a second
        assert served_serial(gateway.grpc_port, pki) == renewed.serial  # gRPC reads the files before a handshake
        assert serial_of(peer_certificate(kept)) == pki.server.serial  # an open connection keeps the old one
        kept.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: gateway\r\n\r\n")
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")
    with grpc_client(gateway, pki, with_certificate=True) as client:
        assert client.is_server_live()


def open_connection(port: int, pki: Pki) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=pki.ca.cert_file)
    context.load_cert_chain(pki.client.cert_file, pki.client.key_file)
    context.set_alpn_protocols(["h2", "http/1.1"])  # gRPC's listener wants h2 offered; uvicorn picks none
    return context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5.0), server_hostname="127.0.0.1")


def peer_certificate(connection: ssl.SSLSocket) -> bytes:
    der = connection.getpeercert(binary_form=True)
    assert der is not None
    return der


def served_serial(port: int, pki: Pki) -> int:
    with open_connection(port, pki) as connection:
        return serial_of(peer_certificate(connection))


def until_served(port: int, pki: Pki, serial: int, timeout_s: float = 10.0) -> int:
    """The serial new connections get, once it is ``serial`` or ``timeout_s`` has passed (the watcher polls)."""
    deadline = time.monotonic() + timeout_s
    seen = served_serial(port, pki)
    while seen != serial and time.monotonic() < deadline:
        time.sleep(0.1)
        seen = served_serial(port, pki)
    return seen


def test_every_worker_serves_tls_with_client_certificates_over_both_protocols(pki: Pki, tmp_path: Path) -> None:
    """``serve --workers 2``: each worker opens the shared ports with the same TLS settings; several connections
    (spread over the workers by the kernel) are all served with a certificate and refused without one."""
    server = pki.ca.issue(tmp_path, "server", server=True)  # its own: another test renews the module's on disk
    (tmp_path / "repository").mkdir()
    client_files = (str(pki.ca.cert_file), str(pki.client.cert_file), str(pki.client.key_file))
    with gateway_process(tmp_path / "repository", tmp_path, token="tls-workers", ready_tls=client_files,
                         tls_cert_file=str(server.cert_file), tls_key_file=str(server.key_file),
                         tls_client_ca_file=str(pki.ca.cert_file), workers="2") as node:
        served = {served_serial(node.http_port, pki) for _ in range(8)} | {served_serial(node.grpc_port, pki)}
        for _ in range(4):
            with grpcclient.InferenceServerClient(node.grpc_url, ssl=True, root_certificates=str(pki.ca.cert_file),
                                                  private_key=str(pki.client.key_file),
                                                  certificate_chain=str(pki.client.cert_file)) as client:
                assert client.is_server_live()
        without_certificate = httpclient.InferenceServerClient(
            node.http_url, ssl=True, connection_timeout=5.0, ssl_options={"ca_certs": str(pki.ca.cert_file)}
        )
        with pytest.raises(REFUSED):
            without_certificate.is_server_live()
        # The node's /metrics merges the workers': one notAfter, not the sum of theirs.
        presented = scraped_expiry(node.http_url, pki)[("tls_cert_file", "CN=server", f"{server.serial:x}")]
    assert served == {server.serial}
    assert presented == not_after_of(server.cert_file)


def test_a_client_ca_replaced_on_disk_refuses_the_old_cas_clients_over_both_protocols(tmp_path: Path) -> None:
    """Replacing the client CA file (dropping a compromised CA) holds for the next connection on both listeners,
    HTTP included: its context once kept every CA it had ever loaded."""
    old_ca, new_ca = make_authority(tmp_path, "old-ca"), make_authority(tmp_path, "new-ca")
    server = new_ca.issue(tmp_path, "server", server=True)
    old = Pki(tmp_path, new_ca, server, old_ca.issue(tmp_path, "old-client", server=False))
    new = Pki(tmp_path, new_ca, server, new_ca.issue(tmp_path, "new-client", server=False))
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(old_ca.cert_file.read_bytes())
    (tmp_path / "repository").mkdir()
    settings = Settings(repository=tmp_path / "repository", port=0, grpc_port=0, tls_cert_file=server.cert_file,
                        tls_key_file=server.key_file, tls_client_ca_file=client_ca)
    with running_gateway(settings) as gateway:
        assert http_client(gateway, old, with_certificate=True).is_server_live()
        swapped = tmp_path / "swapped.pem"
        swapped.write_bytes(new_ca.cert_file.read_bytes())
        os.replace(swapped, client_ca)

        deadline = time.monotonic() + 10.0  # the watcher looks once a second
        while not http_refuses(gateway, old) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert http_refuses(gateway, old)
        assert http_client(gateway, new, with_certificate=True).is_server_live()
        with grpc_client(gateway, old, with_certificate=True) as client, pytest.raises(InferenceServerException):
            client.is_server_live(client_timeout=5.0)
        with grpc_client(gateway, new, with_certificate=True) as client:
            assert client.is_server_live()


def test_a_kept_alive_connection_of_a_removed_cas_client_is_ended_when_the_ca_is_removed(tmp_path: Path) -> None:
    """A client whose certificate was checked at its handshake keeps its connection open for as long as it sends
    (keep-alive): the removal must end it, or the client is served on it for ever. A client of a CA that stays is
    ended too (the gateway does not tell which CA signed what), and is served again on its next connection."""
    old_ca, new_ca = make_authority(tmp_path, "old-ca"), make_authority(tmp_path, "new-ca")
    server = new_ca.issue(tmp_path, "server", server=True)
    old = Pki(tmp_path, new_ca, server, old_ca.issue(tmp_path, "old-client", server=False))
    new = Pki(tmp_path, new_ca, server, new_ca.issue(tmp_path, "new-client", server=False))
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(old_ca.cert_file.read_bytes() + new_ca.cert_file.read_bytes())
    (tmp_path / "repository").mkdir()
    settings = Settings(repository=tmp_path / "repository", port=0, grpc_port=0, tls_cert_file=server.cert_file,
                        tls_key_file=server.key_file, tls_client_ca_file=client_ca)
    with running_gateway(settings) as gateway:
        connection = open_connection(int(gateway.http_url.split(":")[1]), old)
        with connection:
            request = b"GET /v2/health/live HTTP/1.1\r\nHost: gateway\r\n\r\n"
            connection.sendall(request)
            assert whole_answer(connection).startswith(b"HTTP/1.1 200")  # kept alive: the gateway waits for the next
            swapped = tmp_path / "swapped.pem"
            swapped.write_bytes(new_ca.cert_file.read_bytes())
            os.replace(swapped, client_ca)
            connection.settimeout(10.0)  # the watcher looks once a second; keep-alive alone would wait 75 s
            try:
                ended = connection.recv(4096) == b""
            except TimeoutError:  # still open: an OSError too, so caught first
                ended = False
            except (ssl.SSLError, OSError):
                ended = True
            assert ended, "the removed CA's client kept its connection"
        assert http_refuses(gateway, old)
        assert http_client(gateway, new, with_certificate=True).is_server_live()


def whole_answer(connection: ssl.SSLSocket) -> bytes:
    """One HTTP answer read to its last byte (its head and ``content-length`` bytes), nothing of what follows."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = connection.recv(4096)
        assert chunk, f"the connection closed within the answer: {answer!r}"
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = connection.recv(4096)
        assert chunk, "the connection closed within the answer's body"
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls1.2", "tls1.3"])
def test_a_client_of_a_removed_ca_cannot_resume_a_session_it_held_before_the_removal(
    tmp_path: Path, version: ssl.TLSVersion
) -> None:
    """A resumed session skips the certificate check: the removed CA's client showed its session ticket (TLS 1.3)
    or session id (TLS 1.2) from before the removal and was served. Resumption is off, so it cannot."""
    old_ca, new_ca = make_authority(tmp_path, "old-ca"), make_authority(tmp_path, "new-ca")
    server = new_ca.issue(tmp_path, "server", server=True)
    client = old_ca.issue(tmp_path, "old-client", server=False)
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(old_ca.cert_file.read_bytes())
    (tmp_path / "repository").mkdir()
    settings = Settings(repository=tmp_path / "repository", port=0, grpc_port=0, tls_cert_file=server.cert_file,
                        tls_key_file=server.key_file, tls_client_ca_file=client_ca)
    context = ssl.create_default_context(cafile=str(new_ca.cert_file))
    context.load_cert_chain(str(client.cert_file), str(client.key_file))
    context.minimum_version = context.maximum_version = version
    with running_gateway(settings) as gateway:
        answer, session, reused = live_over(gateway, context)
        assert answer.startswith(b"HTTP/1.1 200")
        assert session is not None
        again = live_over(gateway, context, session)
        assert again[0].startswith(b"HTTP/1.1 200")
        assert again[2] is False  # a full handshake each time, its certificate checked
        swapped = tmp_path / "swapped.pem"
        swapped.write_bytes(new_ca.cert_file.read_bytes())
        os.replace(swapped, client_ca)
        assert wait_until(lambda: live_over(gateway, context)[0] == b"", 10)  # the removal is in force

        resumed, _, reused = live_over(gateway, context, again[1] or session)

    assert (resumed, reused) == (b"", False)


def live_over(
    gateway: RunningGateway, context: ssl.SSLContext, session: ssl.SSLSession | None = None
) -> tuple[bytes, ssl.SSLSession | None, bool]:
    """``GET /v2/health/live`` on a connection of its own (offering ``session``): the answer's first bytes (empty
    when the gateway refused the client), the session to offer next, and whether this one was resumed."""
    host, port = gateway.http_url.split(":")
    raw = socket.create_connection((host, int(port)), timeout=5)
    try:
        connection = context.wrap_socket(raw, server_hostname="localhost", session=session)
    except REFUSED:  # TLS 1.2: the server checks the certificate within the handshake
        raw.close()
        return b"", None, False
    with connection:
        answer = b""
        try:
            connection.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
            while chunk := connection.recv(4096):
                answer += chunk
        except REFUSED:  # TLS 1.3: after the client thinks the handshake done
            pass
        return answer[:12], connection.session, connection.session_reused


def http_refuses(gateway: RunningGateway, pki: Pki) -> bool:
    try:
        http_client(gateway, pki, with_certificate=True).is_server_live()
    except REFUSED:
        return True
    return False


def test_an_expired_certificate_written_over_the_served_one_is_refused_and_metrics_show_the_one_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal job writes an expired certificate (a stale copy): both listeners go on presenting the one they had,
    the log says why, and /metrics gives the notAfter of the certificate served, so an alert on it goes on counting
    down; a good renewal then replaces it everywhere."""
    ca = make_authority(tmp_path)
    server = ca.issue(tmp_path, "server", server=True)
    pki = Pki(tmp_path, ca, server, ca.issue(tmp_path, "client", server=False))
    (tmp_path / "repository").mkdir()
    settings = Settings(repository=tmp_path / "repository", port=0, grpc_port=0, tls_cert_file=server.cert_file,
                        tls_key_file=server.key_file, tls_client_ca_file=ca.cert_file)
    ca_series = ("tls_client_ca_file", "CN=switchyard test ca", f"{ca.cert.serial_number:x}")
    first = {("tls_cert_file", "CN=server", f"{server.serial:x}"): not_after_of(server.cert_file),
             ca_series: not_after_of(ca.cert_file)}
    with running_gateway(settings) as gateway:
        assert scraped_expiry(gateway.http_url, pki) == first

        ca.issue(tmp_path, "server", server=True, valid=validity(starts=-days(90), ends=-days(1)))
        assert wait_until(lambda: "TLS certificate not reloaded" in caplog.text, timeout_s=10)
        assert f"SWITCHYARD_TLS_CERT_FILE ({server.cert_file}) holds a certificate (CN=server) that expired at" in (
            caplog.text)
        assert {served_serial(port, pki) for port in (gateway.http_port, gateway.grpc_port)} == {server.serial}
        assert scraped_expiry(gateway.http_url, pki) == first

        renewed = ca.issue(tmp_path, "server", server=True, valid=validity(starts=-days(1), ends=days(90)))
        assert until_served(gateway.http_port, pki, renewed.serial) == renewed.serial
        assert served_serial(gateway.grpc_port, pki) == renewed.serial
        assert scraped_expiry(gateway.http_url, pki) == {
            ("tls_cert_file", "CN=server", f"{renewed.serial:x}"): not_after_of(renewed.cert_file),
            ca_series: not_after_of(ca.cert_file),
        }


def scraped_expiry(http_url: str, pki: Pki) -> dict[tuple[str, str, str], float]:
    """``switchyard_tls_certificate_expiry_timestamp_seconds`` from /metrics over HTTPS, by its labels."""
    context = ssl.create_default_context(cafile=pki.ca.cert_file)
    context.load_cert_chain(pki.client.cert_file, pki.client.key_file)
    text = httpx.get(f"https://{http_url}/metrics", verify=context, timeout=10.0).text
    return {
        (sample.labels["setting"], sample.labels["subject"], sample.labels["serial"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "switchyard_tls_certificate_expiry_timestamp_seconds"
        for sample in family.samples
    }
