"""TLS for the gateway's listeners and for its connection to Triton, built from the ``SWITCHYARD_TLS_*`` and
``SWITCHYARD_TRITON_TLS_*`` settings.

Certificates are reloaded without a restart. The HTTP listener keeps one ``ssl.SSLContext`` (the one uvicorn
listens with); a watcher builds a whole new context when the files change, and the listener's context hands each
new handshake over to the newest one as it starts (its ``sni_callback``, which OpenSSL calls for every ClientHello,
with or without a server name), so new handshakes get the new certificate and client CA and open connections keep
theirs. A new context, not the chain loaded again into the old one: a context's trusted CAs can only be added to,
so a client CA removed from the file would stay trusted until a restart. The gRPC listener's credentials ask
``ServerTls.grpc_fetch`` before every handshake, which reads the files again only when they changed. A change
that does not load (half-written files, a key that does not match, a certificate outside its validity dates) is
logged and the previous chain stays; one refused only because it is not valid yet is loaded at its notBefore. The
Triton backend opens new channels to Triton when ``triton_tls_files`` change (``backends/triton/channels.py``).
The certificates' dates (``certificates.py``): a listener certificate outside them stops the start, one close to its
end is warned of, and the gauge shows what is in use.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import grpc
from prometheus_client import Gauge

from services.gateway.security.certificates import CertificatesInUse, FileCertificates, read_dates, utc_now
from services.gateway.security.resumption import without_resumption
from services.gateway.settings import Settings

log = logging.getLogger(__name__)

ClientAuth = Literal["none", "optional", "required"]
RELOAD_INTERVAL_S = 1.0
"""How often the HTTP listener's watcher looks at the certificate files' inode, size and mtime."""


class TlsError(Exception):
    """A certificate or key the gateway cannot use; the message names the setting and the file. ``valid_from``: the
    only fault is a certificate not valid yet, until then."""

    def __init__(self, message: str, *, valid_from: datetime.datetime | None = None) -> None:
        super().__init__(message)
        self.valid_from = valid_from


Stamps = tuple[tuple[int, int, int] | None, ...]

CONSEQUENCES = {
    "tls_cert_file": "clients refuse it in the handshake",
    "tls_client_ca_file": "client certificates it signed are refused",
    "triton_tls_cert_file": "Triton refuses the gateway's connections with it",
    "triton_tls_ca_file": "a Triton certificate it signed is refused",
}
"""What a certificate of each file does outside its validity dates, for the log lines and errors."""


@dataclass(frozen=True)
class TlsFile:
    """A file named by a setting, so that every error can say which variable to fix."""

    setting: str
    path: Path

    def read(self) -> bytes:
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise TlsError(f"{self.variable} names {self.path}, which cannot be read: {exc.strerror or exc}") from None
        if b"-----BEGIN " not in data:
            raise TlsError(f"{self.variable} names {self.path}, which holds no PEM block (expected -----BEGIN ...)")
        return data

    @property
    def variable(self) -> str:
        return f"SWITCHYARD_{self.setting.upper()}"

    def stamp(self) -> tuple[int, int, int] | None:
        """What changes when the file is rewritten or replaced (a rename, a Kubernetes secret's symlink swap)."""
        try:
            found = os.stat(self.path)
        except OSError:
            return None
        return found.st_ino, found.st_size, found.st_mtime_ns

    def certificates(self, pem: bytes, *, chain: bool) -> FileCertificates:
        """The dates of the certificates in ``pem`` (this file's content) the gateway uses: a chain's first."""
        named = f"{self.variable} ({self.path})"
        return FileCertificates(self.setting, named, read_dates(pem, named, chain=chain), CONSEQUENCES[self.setting],
                                presented=chain)


def refuse_outside_dates(presented: FileCertificates) -> None:
    """``TlsError`` naming the file, the date passed and the current time when the presented certificate is not
    valid now: the other side of every handshake would refuse it."""
    now = utc_now()
    for dates in presented.certificates:
        if dates.outside(now) is not None:
            valid_from = dates.not_before if now < dates.not_before else None
            raise TlsError(presented.message(dates, now), valid_from=valid_from)


@dataclass
class Seen:
    """What a watcher saw of its files at its last look: their stamps, and when files refused only because their
    certificate is not valid yet are due to be loaded again (the files do not change when that time comes)."""

    stamps: Stamps
    retry_at: datetime.datetime | None = None

    def due(self, stamps: Stamps) -> bool:
        return stamps != self.stamps or (self.retry_at is not None and utc_now() >= self.retry_at)

    def saw(self, stamps: Stamps, refused: TlsError | None = None) -> None:
        self.stamps, self.retry_at = stamps, refused.valid_from if refused is not None else None

    def retry_note(self) -> str:
        return "; it is loaded at its notBefore if the files stay as they are" if self.retry_at is not None else ""


@dataclass(frozen=True)
class ServerTlsFiles:
    cert: TlsFile
    key: TlsFile
    client_ca: TlsFile | None
    client_auth: ClientAuth

    @staticmethod
    def from_settings(settings: Settings) -> ServerTlsFiles | None:
        """None when the listeners serve plain HTTP and gRPC (no ``tls_cert_file``)."""
        if settings.tls_cert_file is None or settings.tls_key_file is None:
            return None
        client_ca = settings.tls_client_ca_file
        auth: ClientAuth = settings.tls_client_auth or ("required" if client_ca is not None else "none")
        return ServerTlsFiles(
            TlsFile("tls_cert_file", settings.tls_cert_file),
            TlsFile("tls_key_file", settings.tls_key_file),
            TlsFile("tls_client_ca_file", client_ca) if client_ca is not None else None,
            auth,
        )

    def stamps(self) -> Stamps:
        watched = (self.cert, self.key) if self.client_ca is None else (self.cert, self.key, self.client_ca)
        return tuple(file.stamp() for file in watched)


class ServerTls:
    """One listener side's TLS: the HTTP ``SSLContext`` (reloaded by ``watch``) and the gRPC credentials.

    Construction reads every file and raises ``TlsError`` naming the setting and the file when one is missing,
    unreadable, not PEM, when the key does not belong to the certificate, or when the certificate is outside its
    validity dates: the gateway refuses to start then. ``expiry``: the gauge of the certificates in use;
    ``announce``: log a certificate close to its end and a client CA outside its dates (the start check does).
    """

    def __init__(self, files: ServerTlsFiles, *, expiry: Gauge | None = None, announce: bool = False) -> None:
        self.files = files
        self.reloads = 0
        """Chains loaded since the start (by the HTTP watcher); tests and logs read it."""
        self.in_use = CertificatesInUse(expiry)
        """The dates of what HTTP handshakes use now."""
        self.current, loaded = self._loaded_context()
        """What HTTP handshakes use now: replaced whole by each reload that loads."""
        self.context, _ = self._loaded_context()
        """The listener's context: uvicorn's, fixed for its life; it hands each handshake to ``current``."""
        self.context.sni_callback = self._hand_over
        self._seen = Seen(files.stamps())
        self._grpc_seen = Seen(self._seen.stamps)
        self._watcher: asyncio.Task[None] | None = None
        self.in_use.use(loaded, announce=announce)
        self.client_ca_removed: list[Callable[[], int]] = []
        """Called on the watcher's loop when a reload dropped a client CA: each ends its listener's connections
        whose client presented a certificate, and says how many (a handshake checks the certificate only once)."""

    # -- HTTP -------------------------------------------------------------------------------------------------
    def uvicorn_factory(self, config: object, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        """uvicorn's ``ssl_context_factory``: uvicorn calls it on its event loop as it starts serving, which is
        where the watcher must run (the handshakes happen on that thread, so a reload never races one)."""
        with contextlib.suppress(RuntimeError):  # no running loop: a caller outside uvicorn only wants the context
            self.start_watching()
        return self.context

    def start_watching(self, interval_s: float = RELOAD_INTERVAL_S) -> None:
        """Start the watcher on the running loop (once); it ends with the loop."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self.watch(interval_s), name="tls-reload")

    async def watch(self, interval_s: float = RELOAD_INTERVAL_S) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.reload_if_changed()
            self.in_use.tick()

    def reload_if_changed(self) -> bool:
        """Load the chain again when a file changed (or a refused one became valid); True when the context now
        holds new files."""
        stamps = self.files.stamps()
        if not self._seen.due(stamps):
            return False
        try:
            # A context of its own: nothing of a change that does not load reaches a handshake.
            current, loaded = self._loaded_context()
        except TlsError as exc:
            self._seen.saw(stamps, exc)  # a broken change is reported once, not every second
            log.error("TLS certificate not reloaded, the previous one stays in use: %s%s", exc, self._seen.retry_note())
            return False
        self._seen.saw(stamps)
        removed = _client_cas(self.current) - _client_cas(current)
        self.current = current
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.files.cert.path)
        self.in_use.use(loaded)
        if removed:
            ended = sum(listener() for listener in self.client_ca_removed)
            log.warning(
                "%d client CA(s) removed from %s: %d HTTP connection(s) of clients with a certificate end after the "
                "answer they are writing (they reconnect and are checked against the CAs in force)",
                len(removed), self.files.client_ca.path if self.files.client_ca is not None else "", ended,
            )
        return True

    def _hand_over(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                   listener: ssl.SSLContext) -> None:
        """The listener's ``sni_callback``, on the event loop's thread: the handshake goes on with the newest
        certificate, key and client CA (OpenSSL takes the chain and the trust store of the context set here)."""
        connection.context = self.current

    def _loaded_context(self) -> tuple[ssl.SSLContext, tuple[FileCertificates, ...]]:
        context = self._server_context()
        return context, self._load_into(context)

    def _server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = _VERIFY_MODES[self.files.client_auth]
        if context.verify_mode != ssl.CERT_NONE:
            without_resumption(context)  # a resumed session would skip the check against the client CAs in force
        return context

    def _load_into(self, context: ssl.SSLContext) -> tuple[FileCertificates, ...]:
        """Load the files into ``context``; the dates of the certificate presented and of the client CAs."""
        files = self.files
        chain, _ = files.cert.read(), files.key.read()  # a clear error for a missing or non-PEM file before OpenSSL's
        try:
            context.load_cert_chain(files.cert.path, files.key.path)
        except ssl.SSLError as exc:
            raise TlsError(
                f"{files.key.variable} ({files.key.path}) does not hold the private key of the certificate in "
                f"{files.cert.variable} ({files.cert.path}), or one of them is not valid PEM: {exc.reason or exc}"
            ) from None
        presented = files.cert.certificates(chain, chain=True)
        refuse_outside_dates(presented)
        if files.client_ca is None or files.client_auth == "none":
            return (presented,)
        ca = files.client_ca
        bundle = ca.read()
        try:
            context.load_verify_locations(cadata=bundle.decode("ascii", errors="replace"))
        except ssl.SSLError as exc:
            reason = exc.reason or exc
            raise TlsError(f"{ca.variable} ({ca.path}) holds no valid CA certificate: {reason}") from None
        return presented, ca.certificates(bundle, chain=False)

    # -- gRPC -------------------------------------------------------------------------------------------------
    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Credentials that ask ``grpc_fetch`` before every handshake. grpcio offers "require" or "do not ask":
        ``client_auth="optional"`` does not ask a gRPC client for its certificate."""
        return grpc.dynamic_ssl_server_credentials(
            self._grpc_configuration(),
            self.grpc_fetch,  # type: ignore[arg-type]  # grpcio documents None (no change); its stubs omit it
            require_client_authentication=self.files.client_auth == "required",
        )

    def grpc_fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC on its own threads before each handshake: None keeps the current certificate."""
        stamps = self.files.stamps()
        if not self._grpc_seen.due(stamps):
            return None
        try:
            configuration = self._grpc_configuration()
        except TlsError as exc:
            self._grpc_seen.saw(stamps, exc)
            log.error("gRPC TLS certificate not reloaded, the previous one stays in use: %s%s", exc,
                      self._grpc_seen.retry_note())
            return None
        self._grpc_seen.saw(stamps)
        return configuration

    def _grpc_configuration(self) -> grpc.ServerCertificateConfiguration:
        files = self.files
        self._load_into(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))  # the same checks (and messages) as HTTP's
        roots = files.client_ca.read() if files.client_ca is not None and files.client_auth == "required" else None
        return grpc.ssl_server_certificate_configuration([(files.key.read(), files.cert.read())], roots)


def _client_cas(context: ssl.SSLContext) -> set[bytes]:
    """The client CAs ``context`` trusts, as DER."""
    return {bytes(der) for der in context.get_ca_certs(binary_form=True)}


_VERIFY_MODES: dict[ClientAuth, ssl.VerifyMode] = {
    "none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED,
}


def server_tls(settings: Settings, *, expiry: Gauge | None = None, announce: bool = False) -> ServerTls | None:
    """The listeners' TLS, or None for plain HTTP and gRPC; raises ``TlsError`` for files it cannot use."""
    files = ServerTlsFiles.from_settings(settings)
    return ServerTls(files, expiry=expiry, announce=announce) if files is not None else None


# -- to Triton -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TritonTls:
    credentials: grpc.ChannelCredentials
    certificates: tuple[FileCertificates, ...]
    """The dates of the client certificate and of the CAs the channels are built with."""


def triton_tls(settings: Settings, *, renewal: bool = False) -> TritonTls | None:
    """TLS (mutual when a client certificate is set) for the gRPC channels to Triton; None: plain gRPC. Triton's
    HTTP front end has no TLS, so the settings refuse ``triton_tls`` with ``triton_http_url``.

    A client certificate outside its validity dates is refused (``TlsError``) for a ``renewal``: the channels keep
    the files they have. At the start it is let through, as a certificate Triton does not trust is (the gateway
    starts and connects once a renewed one is written; ``check_tls_files`` logs it)."""
    if not settings.triton_tls:
        return None
    ca_file, cert_file = _named("triton_tls_ca_file", settings), _named("triton_tls_cert_file", settings)
    key_file = _named("triton_tls_key_file", settings)
    roots = ca_file.read() if ca_file is not None else None
    key = key_file.read() if key_file is not None else None
    chain = cert_file.read() if cert_file is not None else None
    certificates: list[FileCertificates] = []
    if cert_file is not None and key_file is not None and chain is not None:
        _check_pair(cert_file, key_file)
        certificates.append(cert_file.certificates(chain, chain=True))
        if renewal:
            refuse_outside_dates(certificates[-1])
    if ca_file is not None and roots is not None:
        certificates.append(ca_file.certificates(roots, chain=False))
    credentials = grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)
    return TritonTls(credentials, tuple(certificates))


def triton_tls_files(settings: Settings) -> tuple[TlsFile, ...]:
    """The files the channels to Triton are built from (none without ``triton_tls``): a change to any of them is a
    new certificate, key or CA to connect with."""
    if not settings.triton_tls:
        return ()
    named = (
        ("triton_tls_ca_file", settings.triton_tls_ca_file),
        ("triton_tls_cert_file", settings.triton_tls_cert_file),
        ("triton_tls_key_file", settings.triton_tls_key_file),
    )
    return tuple(TlsFile(setting, path) for setting, path in named if path is not None)


def _named(setting: str, settings: Settings) -> TlsFile | None:
    path: Path | None = getattr(settings, setting)
    return TlsFile(setting, path) if path is not None else None


def _check_pair(cert: TlsFile, key: TlsFile) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert.path, key.path)
    except ssl.SSLError as exc:
        raise TlsError(
            f"{key.variable} ({key.path}) does not hold the private key of the certificate in {cert.variable} "
            f"({cert.path}): {exc.reason or exc}"
        ) from None


def check_tls_files(settings: Settings) -> None:
    """Raise ``TlsError`` (one line, naming the setting and the file) for any TLS file the gateway cannot use; log
    the certificates close to their end, the CAs outside their dates, and a client certificate to Triton outside
    its dates (an error: Triton refuses it until a renewed one is written)."""
    server_tls(settings, announce=True)
    triton = triton_tls(settings)
    if triton is not None:
        CertificatesInUse().use(triton.certificates)

