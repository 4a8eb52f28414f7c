"""TLS for the gateway's listeners and for its connection to Triton, built from the ``SWITCHYARD_TLS_*`` and
``SWITCHYARD_TRITON_TLS_*`` settings.

Certificates are reloaded without a restart. The HTTP listener keeps one ``ssl.SSLContext`` (the one uvicorn
listens with); a watcher builds a whole new context when the files change, and the listener's context hands each
new handshake over to the newest one as it starts (its ``sni_callback``, which OpenSSL calls for every ClientHello,
with or without a server name), so new handshakes get the new certificate and client CA and open connections keep
theirs. A new context, not the chain loaded again into the old one: a context's trusted CAs can only be added to,
so a client CA removed from the file would stay trusted until a restart. The gRPC listener's credentials ask
``ServerTls.grpc_fetch`` before every handshake, which reads the files again only when they changed. A change
that does not load (half-written files, a key that does not match) is logged and the previous chain stays. The
Triton backend opens new channels to Triton when ``triton_tls_files`` change (``backends/triton/channels.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import grpc

from services.gateway.settings import Settings

log = logging.getLogger(__name__)

ClientAuth = Literal["none", "optional", "required"]
RELOAD_INTERVAL_S = 1.0
"""How often the HTTP listener's watcher looks at the certificate files' inode, size and mtime."""


class TlsError(Exception):
    """A certificate or key the gateway cannot use; the message names the setting and the file."""


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

    def stamps(self) -> tuple[tuple[int, int, int] | None, ...]:
        watched = (self.cert, self.key) if self.client_ca is None else (self.cert, self.key, self.client_ca)
        return tuple(file.stamp() for file in watched)


class ServerTls:
    """One listener side's TLS: the HTTP ``SSLContext`` (reloaded by ``watch``) and the gRPC credentials.

    Construction reads every file and raises ``TlsError`` naming the setting and the file when one is missing,
    unreadable, not PEM, or when the key does not belong to the certificate: the gateway refuses to start then.
    """

    def __init__(self, files: ServerTlsFiles) -> None:
        self.files = files
        self.reloads = 0
        """Chains loaded since the start (by the HTTP watcher); tests and logs read it."""
        self.current = self._loaded_context()
        """What HTTP handshakes use now: replaced whole by each reload that loads."""
        self.context = self._loaded_context()
        """The listener's context: uvicorn's, fixed for its life; it hands each handshake to ``current``."""
        self.context.sni_callback = self._hand_over
        self._stamps = files.stamps()
        self._grpc_stamps = self._stamps
        self._watcher: asyncio.Task[None] | None = None

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

    def reload_if_changed(self) -> bool:
        """Load the chain again when a file changed; True when the context now holds new files."""
        stamps = self.files.stamps()
        if stamps == self._stamps:
            return False
        try:
            # A context of its own: nothing of a change that does not load reaches a handshake.
            self.current = self._loaded_context()
        except TlsError as exc:
            log.error("TLS certificate not reloaded, the previous one stays in use: %s", exc)
            return False
        finally:
            self._stamps = stamps  # a broken change is reported once, not every second
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.files.cert.path)
        return True

    def _hand_over(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                   listener: ssl.SSLContext) -> None:
        """The listener's ``sni_callback``, on the event loop's thread: the handshake goes on with the newest
        certificate, key and client CA (OpenSSL takes the chain and the trust store of the context set here)."""
        connection.context = self.current

    def _loaded_context(self) -> ssl.SSLContext:
        context = self._server_context()
        self._load_into(context)
        return context

    def _server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = _VERIFY_MODES[self.files.client_auth]
        return context

    def _load_into(self, context: ssl.SSLContext) -> None:
        files = self.files
        files.cert.read(), files.key.read()  # a clear error for a missing or non-PEM file before OpenSSL's
        try:
            context.load_cert_chain(files.cert.path, files.key.path)
        except ssl.SSLError as exc:
            raise TlsError(
                f"{files.key.variable} ({files.key.path}) does not hold the private key of the certificate in "
                f"{files.cert.variable} ({files.cert.path}), or one of them is not valid PEM: {exc.reason or exc}"
            ) from None
        if files.client_ca is not None and files.client_auth != "none":
            ca = files.client_ca
            try:
                context.load_verify_locations(cadata=ca.read().decode("ascii", errors="replace"))
            except ssl.SSLError as exc:
                reason = exc.reason or exc
                raise TlsError(f"{ca.variable} ({ca.path}) holds no valid CA certificate: {reason}") from None

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
        if stamps == self._grpc_stamps:
            return None
        self._grpc_stamps = stamps
        try:
            return self._grpc_configuration()
        except TlsError as exc:
            log.error("gRPC TLS certificate not reloaded, the previous one stays in use: %s", exc)
            return None

    def _grpc_configuration(self) -> grpc.ServerCertificateConfiguration:
        files = self.files
        self._load_into(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))  # the same checks (and messages) as HTTP's
        roots = files.client_ca.read() if files.client_ca is not None and files.client_auth == "required" else None
        return grpc.ssl_server_certificate_configuration([(files.key.read(), files.cert.read())], roots)


_VERIFY_MODES: dict[ClientAuth, ssl.VerifyMode] = {
    "none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED,
}


def server_tls(settings: Settings) -> ServerTls | None:
    """The listeners' TLS, or None for plain HTTP and gRPC; raises ``TlsError`` for files it cannot use."""
    files = ServerTlsFiles.from_settings(settings)
    return ServerTls(files) if files is not None else None


# -- to Triton -----------------------------------------------------------------------------------------------
def triton_channel_credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    """TLS (mutual when a client certificate is set) for the gRPC channels to Triton; None: plain gRPC. Triton's
    HTTP front end has no TLS, so the settings refuse ``triton_tls`` with ``triton_http_url``."""
    if not settings.triton_tls:
        return None
    roots = _optional("triton_tls_ca_file", settings.triton_tls_ca_file)
    key = _optional("triton_tls_key_file", settings.triton_tls_key_file)
    chain = _optional("triton_tls_cert_file", settings.triton_tls_cert_file)
    if key is not None and chain is not None:
        _check_pair(TlsFile("triton_tls_cert_file", settings.triton_tls_cert_file or Path()),
                    TlsFile("triton_tls_key_file", settings.triton_tls_key_file or Path()))
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)


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


def _optional(setting: str, path: Path | None) -> bytes | None:
    return TlsFile(setting, path).read() if path is not None else None


def _check_pair(cert: TlsFile, key: TlsFile) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert.path, key.path)
    except ssl.SSLError as exc:
        raise TlsError(
            f"{key.variable} ({key.path}) does not hold the private key of the certificate in {cert.variable} "
            f"({cert.path}): {exc.reason or exc}"
        ) from None


def check_tls_files(settings: Settings) -> None:
    """Raise ``TlsError`` (one line, naming the setting and the file) for any TLS file the gateway cannot use."""
    server_tls(settings)
    triton_channel_credentials(settings)

