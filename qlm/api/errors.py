"""Errors in OpenAI's format: `{"error": {"message", "type", "param", "code"}}`.

Every error the API returns goes through `ApiError`, including FastAPI's own validation and
routing errors (see `install_error_handlers`), so clients see one shape everywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class ApiError(Exception):
    """An error answered to the client: HTTP status plus OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = INVALID_REQUEST,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: Mapping[str, str] | None = None) -> Response:
        return Response(
            json.dumps(self.body()).encode(),
            status_code=self.status,
            media_type="application/json",
            headers={**self.headers, **(headers or {})},
        )


# Pydantic adds the member type of a union to error locations ("prompt", "str"); these parts
# are types, not fields, and are left out of `param`.
_TYPE_PART = re.compile(r"^(str|int|float|bool|none|list|dict|literal|function-\w+)($|\[)")


def param_of(loc: Sequence[int | str]) -> str | None:
    """OpenAI-style parameter path from a pydantic location: messages[0].content."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _TYPE_PART.match(part):
            out += f".{part}" if out else part
    return out or None


def from_validation_errors(errors: Sequence[Any], skip: int = 0) -> ApiError:
    """One ApiError (400) for pydantic errors, naming the parameter of the first error; a
    broken constraint is preferred to a type mismatch (for a union, the member that matched
    the type explains more). `skip` drops leading location parts (FastAPI's "body")."""
    err = sorted(errors, key=lambda e: str(e.get("type", "")).endswith("_type"))[0]
    kind = err.get("type", "")
    if kind == "json_invalid":
        return ApiError(400, f"Malformed JSON body: {err.get('msg', '')}", code="invalid_json")
    param = param_of(tuple(err.get("loc", ()))[skip:])
    if param is None:
        return ApiError(400, "The request body must be a JSON object.", code="invalid_body")
    if kind == "extra_forbidden":
        return ApiError(
            400,
            f"Unknown or unsupported parameter '{param}': QLM refuses a field it does not "
            "honour rather than ignoring it (qlm/api/README.md lists the accepted fields).",
            param=param,
            code="unsupported_parameter",
        )
    return ApiError(400, f"Invalid value for '{param}': {err.get('msg', '')}", param=param)


def from_pydantic(exc: ValidationError, skip: int = 0) -> ApiError:
    return from_validation_errors(exc.errors(include_url=False), skip)


def _status_code(status: int) -> str:
    return {404: "not_found", 405: "method_not_allowed"}.get(status, f"http_{status}")


def install_error_handlers(app: FastAPI) -> None:
    """Route every error FastAPI or Starlette raise through the OpenAI error format."""

    async def api_error(_: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def validation_error(_: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        # FastAPI locations start with where the value came from: body, path, query, header.
        return from_validation_errors(errors, skip=1).response()

    async def http_error(_: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind = SERVER_ERROR if exc.status_code >= 500 else INVALID_REQUEST
        err = ApiError(exc.status_code, str(exc.detail), code=_status_code(exc.status_code))
        err.type = kind
        return err.response(exc.headers)

    async def unexpected(_: HttpRequest, exc: Exception) -> Response:
        return ApiError(500, "Internal server error.", type=SERVER_ERROR).response()

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
