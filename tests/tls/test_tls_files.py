"""The TLS settings and files, without a server: what the gateway refuses at startup (naming the variable and the
file), and a reload that keeps the previous certificate when the new files do not load; the certificates' validity
dates (a certificate outside them refused, one close to its end warned of, the gauge of the dates in use)."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from services.gateway.metrics import GatewayMetrics
from services.gateway.security import ServerTls, TlsError, check_tls_files, server_tls, triton_tls
from services.gateway.settings import Settings
from tests.tls.certificates import (
    Authority,
    Issued,
    Validity,
    days,
    make_authority,
    not_after_of,
    serial_of,
    validity,
)
from tests.waiting import wait_until


@pytest.fixture
def issued(tmp_path: Path) -> tuple[Issued, Issued]:
    """A server certificate and another one (its key belongs to neither's partner)."""
    ca = make_authority(tmp_path)
    return ca.issue(tmp_path, "server", server=True), ca.issue(tmp_path, "other", server=True)


def listener_settings(tmp_path: Path, cert: Path, key: Path, **more: object) -> Settings:
    return Settings(repository=tmp_path, tls_cert_file=cert, tls_key_file=key, **more)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"tls_cert_file": "c.pem"}, "SWITCHYARD_TLS_CERT_FILE and SWITCHYARD_TLS_KEY_FILE go together"),
        ({"triton_tls": True, "triton_tls_key_file": "k.pem"}, "SWITCHYARD_TRITON_TLS_CERT_FILE and"),
        ({"tls_client_ca_file": "ca.pem"}, "SWITCHYARD_TLS_CLIENT_CA_FILE needs SWITCHYARD_TLS_CERT_FILE"),
        ({"tls_client_auth": "required"}, "SWITCHYARD_TLS_CLIENT_AUTH=required needs SWITCHYARD_TLS_CLIENT_CA_FILE"),
        ({"triton_tls_ca_file": "ca.pem"}, "SWITCHYARD_TRITON_TLS is false"),
        ({"triton_tls": True, "triton_http_url": "h:1"}, "Triton's HTTP front end has no TLS"),
    ],
)
def test_settings_that_do_not_fit_together_are_refused(values: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        Settings(**values)  # type: ignore[arg-type]


def test_plain_listeners_need_no_files(tmp_path: Path) -> None:
    assert server_tls(Settings(repository=tmp_path)) is None


def test_a_missing_key_file_names_its_variable_and_path(tmp_path: Path, issued: tuple[Issued, Issued]) -> None:
    missing = tmp_path / "absent.key"
    with pytest.raises(TlsError, match=f"SWITCHYARD_TLS_KEY_FILE names {missing}, which cannot be read"):
        check_tls_files(listener_settings(tmp_path, issued[0].cert_file, missing))


def test_a_file_without_pem_is_refused(tmp_path: Path, issued: tuple[Issued, Issued]) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"not a certificate")
    with pytest.raises(TlsError, match="SWITCHYARD_TLS_CERT_FILE names .*garbage.pem, which holds no PEM block"):
        check_tls_files(listener_settings(tmp_path, garbage, issued[0].key_file))


def test_a_key_of_another_certificate_is_refused(tmp_path: Path, issued: tuple[Issued, Issued]) -> None:
    server, other = issued
    with pytest.raises(TlsError, match="SWITCHYARD_TLS_KEY_FILE .*other.key. does not hold the private key"):
        check_tls_files(listener_settings(tmp_path, server.cert_file, other.key_file))
    triton = Settings(repository=tmp_path, triton_tls=True, triton_tls_cert_file=server.cert_file,
                      triton_tls_key_file=other.key_file)
    with pytest.raises(TlsError, match="SWITCHYARD_TRITON_TLS_KEY_FILE .*other.key. does not hold the private key"):
        check_tls_files(triton)


def test_client_auth_defaults_to_required_with_a_client_ca(tmp_path: Path, issued: tuple[Issued, Issued]) -> None:
    server, _ = issued
    client_ca = tmp_path / "ca.pem"  # the fixture's CA
    tls = server_tls(listener_settings(tmp_path, server.cert_file, server.key_file, tls_client_ca_file=client_ca))
    assert tls is not None
    assert tls.files.client_auth == "required"
    plain = server_tls(listener_settings(tmp_path, server.cert_file, server.key_file))
    assert plain is not None
    assert plain.files.client_auth == "none"


def test_a_broken_replacement_keeps_the_previous_certificate(tmp_path: Path, issued: tuple[Issued, Issued]) -> None:
    server, other = issued
    tls = server_tls(listener_settings(tmp_path, server.cert_file, server.key_file))
    assert isinstance(tls, ServerTls)
    assert (tls.reload_if_changed(), tls.grpc_fetch()) == (False, None)  # unchanged: nothing read again
    swapped = tmp_path / "swapped.key"
    swapped.write_bytes(other.key_file.read_bytes())
    os.replace(swapped, server.key_file)  # a key that does not match the certificate, swapped in as deployments do
    assert (tls.reload_if_changed(), tls.grpc_fetch(), tls.reloads) == (False, None, 0)
    make_authority(tmp_path, "renewed").issue(tmp_path, "server", server=True)  # a whole new pair
    assert tls.reload_if_changed() is True
    assert tls.grpc_fetch() is not None
    assert tls.reloads == 1


def served_certificate(server: ssl.SSLContext, ca_file: Path) -> bytes:
    """The certificate (DER) a handshake with ``server`` presents, in memory: no socket, no server."""
    client_context = ssl.create_default_context(cafile=ca_file)
    client_context.check_hostname = False
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context.wrap_bio(to_client, to_server)
    from_client, from_server = ssl.MemoryBIO(), ssl.MemoryBIO()
    accepted = server.wrap_bio(from_client, from_server, server_side=True)
    for _ in range(10):
        for side in (client, accepted):
            with contextlib.suppress(ssl.SSLWantReadError):  # waits for the other side's bytes
                side.do_handshake()
        from_client.write(to_server.read())
        to_client.write(from_server.read())
    certificate = client.getpeercert(binary_form=True)
    assert certificate is not None, "no handshake"
    return certificate


def test_a_certificate_replaced_before_its_key_keeps_the_previous_pair_serving(
    tmp_path: Path, issued: tuple[Issued, Issued]
) -> None:
    """Deployments rename the new certificate into place, then the new key: in between the pair does not match, and
    the listener must go on handshaking with the pair it had."""
    server, other = issued
    tls = server_tls(listener_settings(tmp_path, server.cert_file, server.key_file))
    assert isinstance(tls, ServerTls)
    before = served_certificate(tls.context, tmp_path / "ca.pem")
    swapped = tmp_path / "swapped.pem"
    swapped.write_bytes(other.cert_file.read_bytes())
    os.replace(swapped, server.cert_file)

    assert tls.reload_if_changed() is False
    assert served_certificate(tls.context, tmp_path / "ca.pem") == before


def client_accepted(server: ssl.SSLContext, ca_file: Path, client: Issued) -> bool:
    """Whether ``server`` completes a handshake with a client presenting ``client``'s certificate, in memory."""
    client_context = ssl.create_default_context(cafile=ca_file)
    client_context.check_hostname = False
    client_context.load_cert_chain(client.cert_file, client.key_file)
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    connecting = client_context.wrap_bio(to_client, to_server)
    from_client, from_server = ssl.MemoryBIO(), ssl.MemoryBIO()
    accepted = server.wrap_bio(from_client, from_server, server_side=True)
    for _ in range(10):
        for side in (connecting, accepted):
            with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLError):  # a refusal ends in an alert
                side.do_handshake()
        from_client.write(to_server.read())
        to_client.write(from_server.read())
    with contextlib.suppress(ValueError):  # "handshake not done yet": refused
        return bool(accepted.getpeercert())
    return False


def test_a_client_ca_replaced_on_disk_stops_trusting_the_clients_of_the_one_it_replaced(tmp_path: Path) -> None:
    """An operator drops a compromised client CA by replacing the file: new HTTP handshakes must trust the new CA
    only (a context's trust store only grows: loading the new CA into the live one kept the old one trusted)."""
    old_ca, new_ca = make_authority(tmp_path, "old-ca"), make_authority(tmp_path, "new-ca")
    server = new_ca.issue(tmp_path, "server", server=True)
    old_client, new_client = old_ca.issue(tmp_path, "old", server=False), new_ca.issue(tmp_path, "new", server=False)
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(old_ca.cert_file.read_bytes())
    tls = server_tls(listener_settings(tmp_path, server.cert_file, server.key_file, tls_client_ca_file=client_ca))
    assert isinstance(tls, ServerTls)
    accepted = {name: client_accepted(tls.context, new_ca.cert_file, client)
                for name, client in (("old", old_client), ("new", new_client))}
    assert accepted == {"old": True, "new": False}

    swapped = tmp_path / "swapped.pem"
    swapped.write_bytes(new_ca.cert_file.read_bytes())
    os.replace(swapped, client_ca)
    assert tls.reload_if_changed() is True

    accepted = {name: client_accepted(tls.context, new_ca.cert_file, client)
                for name, client in (("old", old_client), ("new", new_client))}
    assert accepted == {"old": False, "new": True}


# -- validity dates ------------------------------------------------------------------------------------------------
EXPIRY = "switchyard_tls_certificate_expiry_timestamp_seconds"
SWITCHYARD = Path(sys.executable).with_name("switchyard")


def expired() -> Validity:
    return validity(starts=-days(30), ends=-days(1))


def stamp(moment: datetime.datetime) -> str:
    """A date as the gateway's messages write it: a certificate holds whole seconds."""
    return f"{moment.replace(microsecond=0):%Y-%m-%d %H:%M:%S} UTC"


def said_now(message: str) -> datetime.datetime:
    """The current time a message says (``it is now ...``)."""
    found = re.search(r"it is now (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC", message)
    assert found is not None, message
    return datetime.datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.UTC)


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return make_authority(tmp_path)


@pytest.mark.parametrize(
    ("dates", "says"),
    [
        (expired, "that expired at {not_after} (notAfter)"),
        (lambda: validity(starts=days(2), ends=days(60)), "that is not valid before {not_before} (notBefore)"),
    ],
    ids=["expired", "not-valid-yet"],
)
def test_a_certificate_outside_its_dates_stops_the_start_naming_the_file_the_date_and_the_time_now(
    tmp_path: Path, ca: Authority, dates: object, says: str
) -> None:
    valid = dates()  # type: ignore[operator]
    server = ca.issue(tmp_path, "server", server=True, valid=valid)
    with pytest.raises(TlsError) as refused:
        check_tls_files(listener_settings(tmp_path, server.cert_file, server.key_file))
    message = str(refused.value)
    expected = says.format(not_before=stamp(valid[0]), not_after=stamp(valid[1]))
    assert message.startswith(f"SWITCHYARD_TLS_CERT_FILE ({server.cert_file}) holds a certificate (CN=server) "
                              f"{expected}, and it is now "), message
    assert message.endswith(": clients refuse it in the handshake")
    assert abs(said_now(message) - datetime.datetime.now(datetime.UTC)) < datetime.timedelta(minutes=1)


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_exits_with_one_line_when_its_certificate_expired(tmp_path: Path, ca: Authority, workers: str) -> None:
    """What the operator sees: the start-failure status (2) and one line, before anything listens (a process of its
    own, as it runs: a gateway that started anyway would serve until the timeout)."""
    valid = expired()
    server = ca.issue(tmp_path, "server", server=True, valid=valid)
    (tmp_path / "repository").mkdir()
    environment = {**os.environ, "SWITCHYARD_TLS_CERT_FILE": str(server.cert_file),
                   "SWITCHYARD_TLS_KEY_FILE": str(server.key_file),
                   "SWITCHYARD_STATE_PATH": str(tmp_path / "state" / "routing.json")}
    result = subprocess.run(
        [str(SWITCHYARD), "serve", "--repository", str(tmp_path / "repository"), "--port", "0", "--grpc-port", "0",
         "--workers", workers],
        env=environment, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(
        f"error: SWITCHYARD_TLS_CERT_FILE ({server.cert_file}) holds a certificate (CN=server) that expired at "
        f"{stamp(valid[1])} (notAfter), and it is now "
    ), result.stderr


def test_an_expired_replacement_is_refused_and_the_previous_certificate_keeps_serving(
    tmp_path: Path, ca: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    server = ca.issue(tmp_path, "server", server=True)
    tls = server_tls(listener_settings(tmp_path, server.cert_file, server.key_file))
    assert isinstance(tls, ServerTls)
    ca.issue(tmp_path, "server", server=True, valid=expired())  # a whole expired pair, swapped in over the files

    assert (tls.reload_if_changed(), tls.grpc_fetch(), tls.reloads) == (False, None, 0)
    assert serial_of(served_certificate(tls.context, ca.cert_file)) == server.serial
    refusal = f"not reloaded, the previous one stays in use: SWITCHYARD_TLS_CERT_FILE ({server.cert_file}) holds a " \
              "certificate (CN=server) that expired at "
    assert f"TLS certificate {refusal}" in caplog.text  # HTTP's watcher
    assert f"gRPC TLS certificate {refusal}" in caplog.text


def test_a_replacement_not_valid_yet_is_taken_up_at_its_notbefore(
    tmp_path: Path, ca: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    """A certificate deployed a little ahead of its notBefore (or on a host whose clock lags the CA's) is served as
    soon as it is valid, with no further change to the files to set the watcher off."""
    server = ca.issue(tmp_path, "server", server=True)
    tls = server_tls(listener_settings(tmp_path, server.cert_file, server.key_file))
    assert isinstance(tls, ServerTls)
    soon = ca.issue(tmp_path, "server", server=True,
                    valid=validity(starts=datetime.timedelta(seconds=2), ends=days(30)))

    assert (tls.reload_if_changed(), tls.grpc_fetch()) == (False, None)
    assert "is not valid before" in caplog.text
    assert "it is loaded at its notBefore if the files stay as they are" in caplog.text
    assert serial_of(served_certificate(tls.context, ca.cert_file)) == server.serial
    assert wait_until(tls.reload_if_changed, timeout_s=15, interval_s=0.1)
    assert wait_until(lambda: tls.grpc_fetch() is not None, timeout_s=5, interval_s=0.1)
    assert serial_of(served_certificate(tls.context, ca.cert_file)) == soon.serial


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


@pytest.mark.parametrize(
    ("starts", "ends", "warned"),
    [
        (-days(360), days(5), True),  # a year's certificate with 5 days left
        (-days(300), days(20), False),  # ... with 20 days left
        (-datetime.timedelta(hours=21), datetime.timedelta(hours=3), True),  # a day's, in its last fifth
        (-datetime.timedelta(hours=12), datetime.timedelta(hours=12), False),  # a day's, half-way
    ],
)
def test_a_certificate_close_to_its_end_is_warned_of_at_the_start_and_at_a_reload(
    tmp_path: Path, ca: Authority, caplog: pytest.LogCaptureFixture, starts: datetime.timedelta,
    ends: datetime.timedelta, warned: bool,
) -> None:
    valid = validity(starts=starts, ends=ends)
    server = ca.issue(tmp_path, "server", server=True, valid=valid)
    settings = listener_settings(tmp_path, server.cert_file, server.key_file)
    warning = (f"SWITCHYARD_TLS_CERT_FILE ({server.cert_file}) holds a certificate (CN=server) that expires in "
               f"{{left}}, at {stamp(valid[1])} (notAfter): write a renewed one there before then")
    check_tls_files(settings)
    assert len(warnings_of(caplog)) == warned
    if warned:
        assert re.fullmatch(re.escape(warning).replace(re.escape("{left}"), r"\d+ \w+ \d+ \w+") + ".*",
                            warnings_of(caplog)[0])
    tls = server_tls(settings)  # each process's own, after the start check: quiet
    assert isinstance(tls, ServerTls)
    assert len(warnings_of(caplog)) == warned

    renewed = ca.issue(tmp_path, "server", server=True, valid=validity(starts=starts, ends=ends))
    assert tls.reload_if_changed() is True
    assert len(warnings_of(caplog)) == 2 * warned
    assert serial_of(served_certificate(tls.context, ca.cert_file)) == renewed.serial


def test_client_cas_outside_their_dates_are_warned_of_and_the_others_still_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old_dates = expired()
    old_ca = make_authority(tmp_path, "old-ca", valid=old_dates)
    new_ca = make_authority(tmp_path, "new-ca")
    server, client = new_ca.issue(tmp_path, "server", server=True), new_ca.issue(tmp_path, "client", server=False)
    bundle = tmp_path / "client-ca.pem"
    bundle.write_bytes(old_ca.cert_file.read_bytes() + new_ca.cert_file.read_bytes())
    settings = listener_settings(tmp_path, server.cert_file, server.key_file, tls_client_ca_file=bundle)

    check_tls_files(settings)
    assert warnings_of(caplog) == [
        f"SWITCHYARD_TLS_CLIENT_CA_FILE ({bundle}) holds a CA certificate (CN=switchyard test old-ca) that expired at "
        f"{stamp(old_dates[1])} (notAfter), and it is now {stamp(said_now(caplog.text))}: client certificates it "
        "signed are refused"
    ]
    tls = server_tls(settings)
    assert isinstance(tls, ServerTls)
    assert client_accepted(tls.context, new_ca.cert_file, client)


def test_a_certificate_in_use_that_crosses_into_its_last_days_and_past_its_end_is_logged_once_each(
    tmp_path: Path, ca: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    """The watcher looks every second (``tick``): a certificate fine at the start that nobody renews says so in the
    log before it expires and when it does, not only on the gauge."""
    valid = validity(starts=-days(100), ends=days(30))
    server = ca.issue(tmp_path, "server", server=True, valid=valid)
    tls = server_tls(listener_settings(tmp_path, server.cert_file, server.key_file), announce=True)
    assert isinstance(tls, ServerTls)
    not_after = valid[1].replace(microsecond=0)
    for moment in (not_after - days(20), not_after - days(10), not_after - days(9),
                   not_after + datetime.timedelta(seconds=1)):
        tls.in_use.tick(now=moment)
    levels = [(record.levelname, record.getMessage()) for record in caplog.records]
    assert levels == [
        ("WARNING", f"SWITCHYARD_TLS_CERT_FILE ({server.cert_file}) holds a certificate (CN=server) that expires in "
                    f"10 days 0 hours, at {stamp(not_after)} (notAfter): write a renewed one there before then (it "
                    "is taken up without a restart)"),
        ("ERROR", f"SWITCHYARD_TLS_CERT_FILE ({server.cert_file}) holds a certificate (CN=server) that expired at "
                  f"{stamp(not_after)} (notAfter), and it is now {stamp(not_after + datetime.timedelta(seconds=1))}: "
                  "clients refuse it in the handshake"),
    ]


def test_the_gauge_shows_the_notafter_of_the_certificates_in_use(tmp_path: Path, ca: Authority) -> None:
    registry = CollectorRegistry()
    server = ca.issue(tmp_path, "server", server=True)
    settings = listener_settings(tmp_path, server.cert_file, server.key_file, tls_client_ca_file=ca.cert_file)
    tls = server_tls(settings, expiry=GatewayMetrics(registry).tls_certificate_expiry)
    assert isinstance(tls, ServerTls)

    def expiry(setting: str, subject: str, serial: int) -> float | None:
        return registry.get_sample_value(EXPIRY, {"setting": setting, "subject": subject, "serial": f"{serial:x}"})

    served_until = not_after_of(server.cert_file)
    assert expiry("tls_cert_file", "CN=server", server.serial) == served_until
    assert expiry("tls_client_ca_file", "CN=switchyard test ca", ca.cert.serial_number) == (
        ca.cert.not_valid_after_utc.timestamp())
    ca.issue(tmp_path, "server", server=True, valid=expired())
    assert tls.reload_if_changed() is False
    assert expiry("tls_cert_file", "CN=server", server.serial) == served_until  # still the one served
    renewed = ca.issue(tmp_path, "server", server=True, valid=validity(starts=-days(1), ends=days(90)))
    assert tls.reload_if_changed() is True
    assert expiry("tls_cert_file", "CN=server", renewed.serial) == not_after_of(renewed.cert_file)
    assert expiry("tls_cert_file", "CN=server", server.serial) is None


def test_an_expired_client_certificate_to_triton_is_logged_at_the_start_and_refused_as_a_renewal(
    tmp_path: Path, ca: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway starts without Triton's answer (it connects once Triton takes its certificate, renewed on disk):
    an expired client certificate is an error in the log at the start; written over one in use, it is refused."""
    valid = expired()
    gateway = ca.issue(tmp_path, "gateway", server=False, valid=valid)
    settings = Settings(repository=tmp_path, triton_tls=True, triton_tls_ca_file=ca.cert_file,
                        triton_tls_cert_file=gateway.cert_file, triton_tls_key_file=gateway.key_file)
    check_tls_files(settings)
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert errors == [
        f"SWITCHYARD_TRITON_TLS_CERT_FILE ({gateway.cert_file}) holds a certificate (CN=gateway) that expired at "
        f"{stamp(valid[1])} (notAfter), and it is now {stamp(said_now(errors[0]))}: Triton refuses the gateway's "
        "connections with it"
    ]
    with pytest.raises(TlsError, match=r"SWITCHYARD_TRITON_TLS_CERT_FILE .* that expired at"):
        triton_tls(settings, renewal=True)
