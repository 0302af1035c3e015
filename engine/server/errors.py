"""Every error leaves the server in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

Validation errors, bad JSON, unknown routes, wrong methods and internal failures all go through
these handlers, so a client library (the official `openai` one included) always finds a message
to show. A client's fault is a 4xx; only our own bugs are a 500, and those never leak a traceback.
"""
from __future__ import annotations

import logging

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
          413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error", 503: "unavailable_error"}


class APIError(Exception):
    """An error a handler raises on purpose; it becomes an OpenAI error body."""

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None, type: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers  # e.g. Retry-After on a 503
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, code: str | None = None, param: str | None = None,
               type: str | None = None) -> dict:
    t = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": t, "param": param, "code": code}}


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status, headers=headers)


_UNION_HINTS = {"prompt": "must be a string, a list of strings, a list of token ids or a list of such lists",
                "stop": "must be a string or a list of strings",
                "content": "must be a string or a list of text parts"}


def validation_message(exc: RequestValidationError) -> tuple[str, str | None, str | None]:
    """The first error as "param: message", OpenAI style; bad JSON gets its own message."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None, None
    e = errors[0]
    if e.get("type") == "json_invalid":
        detail = e.get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON ({detail})" if detail else "the request body is not valid JSON", None, "invalid_json"
    loc = [p for p in e.get("loc", ()) if p != "body"]
    if not loc:  # the body as a whole: not an object, or a rule across fields
        if e.get("type") in ("model_attributes_type", "dict_type", "model_type"):
            return "the request body must be a JSON object", None, "invalid_json"
        return str(e.get("msg", "invalid request")).removeprefix("Value error, "), None, "invalid_value"
    # keep field names and list indexes; pydantic's union-branch tags ("constrained-str",
    # "list[int]") mean "none of the accepted types": say which types instead
    is_tag = lambda p: isinstance(p, str) and (any(c in p for c in "[-") or p in ("str", "int"))
    msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
    tag = next((i for i, p in enumerate(loc) if is_tag(p)), None)
    if tag is not None and tag > 0 and str(loc[tag - 1]) in _UNION_HINTS:
        loc, msg = loc[:tag], _UNION_HINTS[str(loc[tag - 1])]
    elif e.get("type") == "missing":
        msg = "field required"
    param = ".".join(str(p) for p in loc if not is_tag(p)) or None
    return f"{param}: {msg}", param, "invalid_value"


def validated(cls, data: dict):
    """A request model built by a route from a translated request (Ollama's, Anthropic's); its
    refusals are 400s with the same message a client's own body would get."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise APIError(400, validation_message(RequestValidationError(e.errors()))[0]) from None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message, exc.code, exc.param, exc.type),
                            status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = validation_message(exc)
        return error_response(400, message, code, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = "no such endpoint"
        return error_response(exc.status_code, message, code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return error_response(500, f"internal server error ({type(exc).__name__})", "internal_error")


def shaped_route(error_response: Callable[[int, str], JSONResponse]) -> type[APIRoute]:
    """A route class whose errors (an APIError, a body that fails validation or does not parse)
    answer in another API's shape, `error_response(status, message)`: Ollama's and Anthropic's
    clients read their own, not OpenAI's."""

    class ShapedRoute(APIRoute):
        def get_route_handler(self) -> Callable:
            handler = super().get_route_handler()

            async def route(request: Request):
                try:
                    return await handler(request)
                except APIError as e:
                    response = error_response(e.status, e.message)
                    response.headers.update(e.headers or {})
                    return response
                except RequestValidationError as e:
                    return error_response(400, validation_message(e)[0])
                except StarletteHTTPException as e:  # FastAPI's own, e.g. a body that is not JSON
                    return error_response(e.status_code, str(e.detail))
            return route

    return ShapedRoute
