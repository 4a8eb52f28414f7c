"""One default SSL context for every httpx client the tests make.

httpx builds each client's default context from certifi's CA bundle: about 24 ms of CPU per client on the two-core
machine, and the tests make thousands of clients (every ``httpx.get`` makes one, and readiness polls make one per
poll). Profiled over the whole suite, that was about a tenth of its CPU. The context for the default settings
(``verify=True``, no client certificate, the CA bundle httpx picks from the environment) is made once and shared, as
one SSLContext can serve any number of connections; any other setting reaches httpx unchanged. The clients nearly all
speak plain HTTP to 127.0.0.1; the TLS tests hand httpx contexts of their own."""

from __future__ import annotations

import functools
import os
import ssl
from typing import Any

import httpx._transports.default as transports  # where HTTPTransport and AsyncHTTPTransport look the function up

_create = transports.create_ssl_context


@functools.cache
def _default_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """httpx's own default context; a new one whenever SSL_CERT_FILE or SSL_CERT_DIR (which it reads) changes."""
    return _create()


def _shared_when_default(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
    if verify is True and cert is None and trust_env:
        return _default_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    return _create(verify=verify, cert=cert, trust_env=trust_env)


def share_default_context() -> None:
    transports.create_ssl_context = _shared_when_default
