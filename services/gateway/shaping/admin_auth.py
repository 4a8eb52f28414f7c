"""Bearer-token check of the admin API. The token is compared in constant time and never logged, echoed or
stored: events name the caller by a fingerprint of it."""

from __future__ import annotations

import hashlib
import hmac

from pydantic import SecretStr
from starlette.requests import Request

from services.gateway.errors import Forbidden, Unauthorized


def fingerprint(token: str) -> str:
    """What the audit log says about who acted: 12 hex digits of the token's SHA-256."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:12]


class AdminAuth:
    def __init__(self, token: SecretStr | None) -> None:
        secret = token.get_secret_value() if token is not None else ""
        self._token = secret.encode() if secret else None

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def check(self, request: Request) -> str:
        """The caller's fingerprint; ``Unauthorized`` (401) without a bearer token, ``Forbidden`` (403) with a wrong
        one or when the admin API is off."""
        return self.verify(request.headers.get("authorization"))

    def verify(self, header: str | None, api: str = "the admin API") -> str:
        """``check`` of an ``Authorization`` value (an HTTP header or gRPC metadata) once a token is configured;
        ``api`` names what asks in the 401's message."""
        if self._token is None:
            raise Forbidden(f"{api} is disabled: start the gateway with SWITCHYARD_ADMIN_TOKEN set to enable it")
        scheme, _, presented = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise Unauthorized(f"{api} needs 'Authorization: Bearer <token>' (the gateway's SWITCHYARD_ADMIN_TOKEN)")
        candidate = presented.strip().encode()
        if not hmac.compare_digest(candidate, self._token):
            raise Forbidden("the admin token is not valid")
        return fingerprint(presented.strip())
