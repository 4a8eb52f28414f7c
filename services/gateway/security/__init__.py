"""Transport security shared by the listeners and the Triton backend (foundation layer: it imports only the
settings). ``tls.py``: the listeners' TLS and mutual TLS with certificates reloaded from disk, and the TLS of the
gRPC channels to Triton; ``certificates.py``: the certificates' validity dates, their warnings and their gauge."""

from services.gateway.security.certificates import CertificatesInUse, FileCertificates
from services.gateway.security.tls import (
    Seen,
    ServerTls,
    TlsError,
    TritonTls,
    check_tls_files,
    server_tls,
    triton_tls,
    triton_tls_files,
)

__all__ = ["CertificatesInUse", "FileCertificates", "Seen", "ServerTls", "TlsError", "TritonTls", "check_tls_files",
           "server_tls", "triton_tls", "triton_tls_files"]
