"""The TLS settings and files, without a server: what the gateway refuses at startup (naming the variable and the
file), and a reload that keeps the previous certificate when the new files do not load."""

from __future__ import annotations

import contextlib
import os
import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.gateway.security import ServerTls, TlsError, check_tls_files, server_tls
from services.gateway.settings import Settings
from tests.tls.certificates import Issued, make_authority


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
