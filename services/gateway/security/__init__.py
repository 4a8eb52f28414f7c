"""Transport security shared by the listeners and the Triton backend (foundation layer: it imports only the
settings). ``tls.py``: the listeners' TLS and mutual TLS with certificates reloaded from disk, and the TLS of the
gRPC channels to Triton."""

from services.gateway.security.tls import (
    ServerTls,
    TlsError,
    check_tls_files,
    server_tls,
    triton_channel_credentials,
    triton_tls_files,
)

__all__ = ["ServerTls", "TlsError", "check_tls_files", "server_tls", "triton_channel_credentials",
           "triton_tls_files"]
