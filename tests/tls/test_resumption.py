"""Session resumption off on a server context that checks client certificates (security/resumption.py): tickets
off, the TLS 1.2 session cache off, or, where that cache cannot be reached, TLS 1.3 only, said in the log."""

from __future__ import annotations

import logging
import ssl

import pytest

from services.gateway.security import resumption


def test_tickets_and_the_session_cache_are_off_and_tls_1_2_stays_allowed() -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2

    resumption.without_resumption(context)

    assert context.num_tickets == 0
    assert context.options & ssl.OP_NO_TICKET
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert resumption._session_cache_off(context) is False  # off already: its mode is no longer OpenSSL's default


def test_where_the_session_cache_cannot_be_reached_the_context_speaks_tls_1_3_only_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(resumption.sys, "version_info", (3, 99, 0))  # a layout the module does not read
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)

    with caplog.at_level(logging.WARNING, logger=resumption.__name__):
        resumption.without_resumption(context)

    assert context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert context.num_tickets == 0
    assert "speaks TLS 1.3 only while it checks client certificates" in caplog.text
