"""Bearer-token check of the admin API, with roles. Tokens come from ``SWITCHYARD_ADMIN_TOKEN`` (an operator) and
from the keys file's ``[admins.<id>]`` tables (``read-only`` or ``operator``; ``switchyard keys add ID --role ...``),
re-read with the API keys. A token is compared in constant time (the setting's) or by its salted hash (the file's)
and never logged, echoed or stored: events name the caller by the file token's id or a fingerprint of the setting's."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from pydantic import SecretStr
from starlette.requests import Request

from services.gateway.errors import Forbidden, Unauthorized
from services.gateway.shaping.keys import ApiKeys
from services.keyfile.format import OPERATOR

DISABLED = (
    "{api} is disabled: start the gateway with SWITCHYARD_ADMIN_TOKEN set to enable it (or with an admin token in a "
    "keys file: switchyard keys add ID --role operator --file keys.toml, SWITCHYARD_API_KEYS_FILE=keys.toml)"
)


def fingerprint(token: str) -> str:
    """What the audit log says about who acted with ``SWITCHYARD_ADMIN_TOKEN``: 12 hex digits of its SHA-256."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who called: the audit log's actor and the role it holds."""

    actor: str
    role: str

    @property
    def operator(self) -> bool:
        return self.role == OPERATOR


class AdminAuth:
    def __init__(self, token: SecretStr | None, keys: ApiKeys | None = None) -> None:
        secret = token.get_secret_value() if token is not None else ""
        self._token = secret.encode() if secret else None
        self._keys = keys if keys is not None and keys.structured else None
        self._tokens = "the gateway's SWITCHYARD_ADMIN_TOKEN"
        """Where tokens come from, for the 401's message: what this gateway takes, no more."""
        if self._keys is not None:
            self._tokens = "an admin token of its keys file" + (" or its SWITCHYARD_ADMIN_TOKEN" if secret else "")

    @property
    def enabled(self) -> bool:
        return self._token is not None or self._keys is not None

    def check(self, request: Request, *, operator: bool = True) -> str:
        """The caller's actor for the audit log; ``Unauthorized`` (401) without a bearer token, ``Forbidden`` (403)
        with a wrong one, with a read-only token where ``operator`` is needed, or when the admin API is off."""
        return self.verify(request.headers.get("authorization"), operator=operator)

    def verify(self, header: str | None, api: str = "the admin API", *, operator: bool = True) -> str:
        """``check`` of an ``Authorization`` value (an HTTP header or gRPC metadata); ``api`` names what asks in
        the messages."""
        caller = self.identify(header, api)
        if operator and not caller.operator:
            raise Forbidden(f"this admin token ({caller.actor}) is read-only: this call needs an operator token")
        return caller.actor

    def identify(self, header: str | None, api: str = "the admin API") -> Caller:
        """Who presents ``header`` and in which role; 401 / 403 as ``check``."""
        if not self.enabled:
            raise Forbidden(DISABLED.format(api=api))
        scheme, _, presented = (header or "").partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            raise Unauthorized(f"{api} needs 'Authorization: Bearer <token>' ({self._tokens})")
        if self._token is not None and hmac.compare_digest(presented.encode(), self._token):
            return Caller(fingerprint(presented), OPERATOR)
        entry = self._keys.admin(presented) if self._keys is not None else None
        if entry is None:
            raise Forbidden("the admin token is not valid")
        return Caller(f"admin:{entry.id}", entry.role)
