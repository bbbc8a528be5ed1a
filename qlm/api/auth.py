"""API keys: which tenant is calling? `Authorization: Bearer <key>`, as the OpenAI client
sends it.

Authentication is on exactly when keys are configured (`ApiAppConfig.api_keys`); without keys
every caller is anonymous and a request's tenant is its `user` field (or "default"), as in the
embedded demo. The ring keeps SHA-256 digests, not keys: a lookup hashes the presented token
and finds its tenant in a dict, so no key is held in plain text after start-up, and no error
message or log line repeats a token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from qlm.api.errors import ApiError
from qlm.config.api_settings import ApiKey

AUTHORIZATION = "authorization"
_CHALLENGE = {"www-authenticate": "Bearer"}


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class KeyRing:
    """Key digests -> tenant names."""

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._tenants = {_digest(k.key.get_secret_value()): k.tenant for k in keys}

    @property
    def enabled(self) -> bool:
        return bool(self._tenants)

    def tenant(self, headers: Mapping[str, str]) -> str:
        """The tenant the request's bearer key belongs to; ApiError 401 otherwise."""
        header = headers.get(AUTHORIZATION)
        if not header:
            raise _unauthorized(
                "Missing API key: send it as 'Authorization: Bearer <key>'.", "missing_api_key"
            )
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized(
                "The Authorization header must be 'Bearer <key>'.", "invalid_authorization"
            )
        tenant = self._tenants.get(_digest(token))
        if tenant is None:
            raise _unauthorized("Incorrect API key provided.", "invalid_api_key")
        return tenant


def _unauthorized(message: str, code: str) -> ApiError:
    return ApiError(401, message, code=code, headers=_CHALLENGE)
