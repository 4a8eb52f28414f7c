"""Who may call the repository API: the admin token's holders (the admin API's check), or anyone when the
gateway runs with ``SWITCHYARD_REPOSITORY_API_OPEN=true``."""

from __future__ import annotations

from types import MappingProxyType

from services.gateway.errors import Forbidden, Unauthorized
from services.gateway.shaping.admin_auth import AdminAuth

ACTOR = "repository-api"
"""The audit log's actor of a repository call (followed by the token's fingerprint when one was checked)."""
_CHALLENGE = MappingProxyType({"WWW-Authenticate": 'Bearer realm="switchyard-repository"'})


class RepositoryAuth:
    def __init__(self, admin: AdminAuth, *, open_api: bool) -> None:
        self._admin = admin
        self._open = open_api

    def check(self, authorization: str | None, *, operator: bool = True) -> str:
        """The actor for the audit log, from the ``Authorization`` header (HTTP) or ``authorization`` metadata (gRPC);
        ``Unauthorized`` (401) without a bearer token, ``Forbidden`` (403) with a wrong one or none configured, or
        with a read-only admin token where ``operator`` is needed (load, unload; the index is read-only)."""
        if self._open:
            return ACTOR
        if not self._admin.enabled:
            raise Forbidden(
                "the repository API needs SWITCHYARD_ADMIN_TOKEN or SWITCHYARD_REPOSITORY_API_OPEN=true (or an "
                "operator token in the API keys file)"
            )
        try:
            return f"{ACTOR} ({self._admin.verify(authorization, 'the repository API', operator=operator)})"
        except Unauthorized as exc:
            raise Unauthorized(str(exc), headers=_CHALLENGE) from None
