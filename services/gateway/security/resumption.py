"""No TLS session resumption where the listener checks client certificates.

A resumed session skips the certificate check: the client shows the ticket (TLS 1.3, and 1.2 with tickets) or the
session id (TLS 1.2, from the server's session cache) of an earlier handshake instead. When an operator removes a
compromised CA from ``SWITCHYARD_TLS_CLIENT_CA_FILE``, a client it signed could go on resuming the sessions it holds
(measured here: a 200 after the CA was removed, over TLS 1.3 and TLS 1.2 alike), so resumption is turned off and every
connection proves its certificate against the client CAs in force.

Tickets are off through the ``ssl`` module's own switches. The TLS 1.2 session cache has none: OpenSSL's
``SSL_CTX_set_session_cache_mode`` is reached through the ``_ssl`` extension's own libssl, on the ``SSL_CTX`` the
context wraps: the first field of CPython's context object from 3.7 to 3.14, the only interpreters it is read on, and
checked by reading the cache mode OpenSSL gives every new context before changing it. Elsewhere, or where that check
fails, the context speaks TLS 1.3 only, which has no session ids, and a warning says so.
"""

from __future__ import annotations

import _ssl
import ctypes
import logging
import ssl
import sys

log = logging.getLogger(__name__)

_SET_SESS_CACHE_MODE = 44  # SSL_CTRL_SET_SESS_CACHE_MODE
_GET_SESS_CACHE_MODE = 45  # SSL_CTRL_GET_SESS_CACHE_MODE
_SESS_CACHE_OFF = 0
_SESS_CACHE_SERVER = 2  # what OpenSSL gives every new context


def without_resumption(context: ssl.SSLContext) -> None:
    """Turn session resumption off on a new server ``context`` (before its first handshake)."""
    context.num_tickets = 0  # TLS 1.3: no NewSessionTicket
    context.options |= ssl.OP_NO_TICKET  # TLS 1.2: no ticket
    if not _session_cache_off(context):
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        log.warning("this Python's ssl module gives no way to turn TLS 1.2 session resumption off, so the HTTP "
                    "listener speaks TLS 1.3 only while it checks client certificates (a resumed session would skip "
                    "the check)")


def _session_cache_off(context: ssl.SSLContext) -> bool:
    if sys.implementation.name != "cpython" or not (3, 7) <= sys.version_info[:2] <= (3, 14):
        return False
    try:
        ctrl = ctypes.CDLL(_ssl.__file__).SSL_CTX_ctrl
        ctrl.restype = ctypes.c_long
        ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        ssl_ctx = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
        if not ssl_ctx or ctrl(ssl_ctx, _GET_SESS_CACHE_MODE, 0, None) != _SESS_CACHE_SERVER:
            return False
        ctrl(ssl_ctx, _SET_SESS_CACHE_MODE, _SESS_CACHE_OFF, None)
        return bool(ctrl(ssl_ctx, _GET_SESS_CACHE_MODE, 0, None) == _SESS_CACHE_OFF)
    except (OSError, AttributeError, ValueError):
        return False
