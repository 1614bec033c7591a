"""HTTP plumbing of the server: OpenAI's error shape, Bearer authentication, the upload size cap, uploads
saved to temporary files of the server's naming."""

from __future__ import annotations

import hmac
import json
import os
import tempfile
from concurrent.futures import Future
from pathlib import Path

from fastapi import UploadFile
from starlette.exceptions import HTTPException

CHUNK = 1 << 20  # bytes an upload is read in

STATUS_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                413: "invalid_request_error", 422: "invalid_request_error", 503: "server_error", 500: "server_error"}


class APIError(HTTPException):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``. An
    HTTPException, so that one raised while FastAPI reads a form (the size cap) keeps its status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(status_code=status, detail=message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": STATUS_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def authorized(header: str | None, key: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer KEY`` (always, when no key is set)."""
    if key is None:
        return True
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


class BodyLimit:
    """ASGI middleware: a request body above ``limit`` bytes gets 413 in OpenAI's shape, whether its
    Content-Length says so (before anything is read) or its streamed chunks add up past it (the reading
    stops there: nothing past the cap is spooled)."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _send_error(send, self._too_large())
        seen = 0
        started = False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise self._too_large()
            return message

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except APIError as exc:  # raised while the body was read, above any handler that would catch it
            if not started:
                await _send_error(send, exc)

    def _too_large(self) -> APIError:
        return APIError(413, f"the upload is larger than the server's cap of {self.limit / 2**20:g} MB "
                        "(tandem serve --max-upload-mb)", "file", "file_too_large")


async def _send_error(send, exc: APIError) -> None:
    body = json.dumps(exc.body()).encode()
    await send({"type": "http.response.start", "status": exc.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


async def save_upload(file: UploadFile, folder: Path, limit: int) -> Path:
    """Copy the upload to a temporary file of the server's naming, in chunks; APIError 413 past ``limit``."""
    fd, name = tempfile.mkstemp(suffix=".upload", dir=folder)
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := await file.read(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise APIError(413, f"the upload is larger than the server's cap of {limit / 2**20:g} MB "
                                   "(tandem serve --max-upload-mb)", "file", "file_too_large")
                out.write(chunk)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    if size == 0:
        Path(name).unlink(missing_ok=True)
        raise APIError(400, "the uploaded file is empty", "file", "invalid_audio")
    return Path(name)


def remove_when_done(future: Future | None, path: Path) -> None:
    """Delete the upload now, or when the rows still reading it finish (``future``: its request's)."""
    if future is None or future.done():
        path.unlink(missing_ok=True)
    else:
        future.add_done_callback(lambda _f: path.unlink(missing_ok=True))
