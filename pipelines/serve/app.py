"""The FastAPI app: OpenAI's audio, chat and model endpoints over the scheduler, ``/metrics`` and ``/health``.

Requests are validated here (model, format, language, temperature) before they queue; an upload is
streamed to a temporary file of the server's own naming (nothing from a request becomes a path) and removed
when its request is done. Errors are OpenAI's JSON shape (``http.APIError``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from ..asr import LanguageError, TranscribeOptions
from .chat import ChatEngine, ChatInputError, ChatSettings
from .formats import RESPONSE_FORMATS, TIMED_FORMATS, chat_body, tandem_figures, transcript_figures, transcription_body
from .http import CHUNK, APIError, BodyLimit, authorized, remove_when_done, save_upload
from .metrics import Metrics
from .options import ServeOptions
from .scheduler import Job, RequestCancelled, Scheduler, SchedulerClosed
from .stream import DONE, ChatStream, TextDeltas, Updates, sse

ASR_ALIAS = "whisper-1"  # what OpenAI clients and tools send by default: the served speech pair
DEFAULT_CHAT_TOKENS = 256


@dataclass
class Served:
    """What one app serves: the loaded speech pair (runner, pair), the chat engine, their scheduler."""

    options: ServeOptions
    scheduler: Scheduler
    metrics: Metrics
    asr: tuple | None = None  # (WhisperRunner, Pair)
    chat: ChatEngine | None = None

    def asr_names(self) -> tuple[str, ...]:
        return (self.asr[1].name, ASR_ALIAS) if self.asr else ()


def create_app(served: Served, grace_seconds: float = 30.0) -> FastAPI:
    """The app over ``served``; its scheduler is started with the app and closed (queued and running requests
    finished, up to ``grace_seconds``) when the app shuts down; ``app.state.drained`` then says whether the
    worker was done in time."""
    options, metrics = served.options, served.metrics
    upload_dir = Path(tempfile.mkdtemp(prefix="tandem-serve-"))

    @asynccontextmanager
    async def lifespan(app):
        served.scheduler.start()
        app.state.drained = False
        try:
            yield
        finally:
            app.state.drained = await asyncio.to_thread(served.scheduler.close, grace_seconds)
            shutil.rmtree(upload_dir, ignore_errors=True)

    app = FastAPI(title="Tandem", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, limit=options.max_upload_bytes + CHUNK)  # the form's other fields besides the file

    @app.exception_handler(APIError)
    async def api_error(_request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(_request, exc: HTTPException):
        return JSONResponse(APIError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError):
        first = (exc.errors() or [{}])[0]
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(APIError(422, f"{param or 'request'}: {first.get('msg', 'invalid')}", param,
                                     "invalid_value").body(), status_code=422)

    def check_key(request: Request) -> None:
        if not authorized(request.headers.get("authorization"), options.api_key):
            raise APIError(401, "missing or wrong API key: send it as 'Authorization: Bearer KEY'", None,
                           "invalid_api_key")

    guarded = [Depends(check_key)]

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics", dependencies=guarded)
    async def prometheus():
        content, media_type = metrics.render()
        return Response(content, media_type=media_type)

    @app.get("/v1/models", dependencies=guarded)
    async def models():
        rows = []
        if served.asr:
            pair = served.asr[1]
            rows += [_model_row(name, pair) for name in served.asr_names()]
        if served.chat:
            rows.append(_model_row(served.chat.name, served.chat.runner.pair))
        return {"object": "list", "data": rows}

    async def audio(request: Request, task: str, file: UploadFile, model: str, language: str | None,
                    prompt: str | None, response_format: str, temperature: float,
                    granularities: list[str] | None, stream: bool | None) -> Response:
        start = time.perf_counter()
        endpoint = "transcriptions" if task == "transcribe" else "translations"
        if model not in served.asr_names():
            raise APIError(404, f"model {model!r} is not served here; choose one of "
                           f"{', '.join(served.asr_names()) or 'none (no speech pair loaded)'}", "model",
                           "model_not_found")
        runner, pair = served.asr
        key = _asr_options(served, task, language, prompt, response_format, temperature, granularities, stream)
        try:
            runner.check_language(key)
        except LanguageError as exc:
            raise APIError(400, str(exc), "language", "unsupported_language") from None
        path, job = await save_upload(file, upload_dir, options.max_upload_bytes), None
        updates = Updates() if stream else None
        try:
            job = _submit(served.scheduler, "asr", key, path, updates and updates.put)
            if stream:
                job.future.add_done_callback(updates.done)
                first = await _next_update(updates, job, request)
                if first is not DONE:
                    return StreamingResponse(_transcript_events(first, updates, job, request, path, start, endpoint),
                                             media_type="text/event-stream")
            transcript = await _wait(job, request)
        finally:
            remove_when_done(job and job.future, path)
        figures = _transcript_done(transcript, path, start, endpoint)
        if stream:  # nothing was said before the end: one done event
            return StreamingResponse(iter(_done_events(transcript, TextDeltas(), figures)),
                                     media_type="text/event-stream")
        body, media_type = transcription_body(transcript, response_format, task, figures)
        return Response(body, media_type=media_type, headers={"x-tandem": json.dumps(figures)})

    def _transcript_done(transcript, path: Path, start: float, endpoint: str) -> dict:
        """The request's figures, counted in the metrics; APIError 400 when its file was not audio."""
        if transcript.error:
            metrics.requests.labels(endpoint, "400").inc()
            raise APIError(400, f"the file could not be decoded as audio: "
                           f"{transcript.error.replace(str(path), 'the upload')}", "file", "invalid_audio")
        latency = time.perf_counter() - start
        figures = transcript_figures(transcript, latency)
        metrics.audio.inc(transcript.duration)
        metrics.decoded("asr", transcript.tokens, transcript.main_calls, transcript.drafted, transcript.accepted)
        metrics.latency.labels(endpoint).observe(latency)
        metrics.requests.labels(endpoint, "200").inc()
        return figures

    def _transcript_events(first, updates: Updates, job: Job, request: Request, path: Path, start: float,
                           endpoint: str):
        """``transcript.text.delta`` events as the request's windows finish, then ``transcript.text.done``."""
        deltas, texts = TextDeltas(), []

        def update(segments) -> list[str]:
            texts.extend(seg.text for seg in segments)
            delta = deltas.feed(" ".join(texts))
            return [sse({"type": "transcript.text.delta", "delta": delta, "logprobs": None})] if delta else []

        return _events([], first, updates, job, request, update,
                       lambda t: _done_events(t, deltas, _transcript_done(t, path, start, endpoint)))

    @app.post("/v1/audio/transcriptions", dependencies=guarded)
    async def transcriptions(request: Request, file: UploadFile = File(...), model: str = Form(...),
                             language: str | None = Form(None), prompt: str | None = Form(None),
                             response_format: str = Form("json"), temperature: float = Form(0.0),
                             timestamp_granularities: list[str] | None = Form(None, alias="timestamp_granularities[]"),
                             stream: bool | None = Form(None)):
        return await audio(request, "transcribe", file, model, language, prompt, response_format, temperature,
                           timestamp_granularities, stream)

    @app.post("/v1/audio/translations", dependencies=guarded)
    async def translations(request: Request, file: UploadFile = File(...), model: str = Form(...),
                           prompt: str | None = Form(None), response_format: str = Form("json"),
                           temperature: float = Form(0.0), stream: bool | None = Form(None)):
        return await audio(request, "translate", file, model, None, prompt, response_format, temperature, None,
                           stream)

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(request: Request):
        start = time.perf_counter()
        try:
            body = await request.json()
        except ValueError:
            raise APIError(400, "the request body must be a JSON object") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        model = body.get("model")
        if served.chat is None or model != served.chat.name:
            names = served.chat.name if served.chat else "none (start the server with --text-model)"
            raise APIError(404, f"model {model!r} is not a chat model served here; choose {names}", "model",
                           "model_not_found")
        settings, messages, stream = _chat_request(body)
        try:
            ids = await asyncio.to_thread(served.chat.prompt, messages)
            served.chat.check(ids, settings)
        except ChatInputError as exc:
            raise APIError(400, str(exc), "messages") from None
        updates = Updates() if stream else None
        job = _submit(served.scheduler, "chat", settings, ids, updates and updates.put)
        if stream:  # the first tokens (or the end) before the response starts: an early failure is a plain error
            job.future.add_done_callback(updates.done)
            first = await _next_update(updates, job, request)
            if first is DONE:
                await _wait(job, request)
            return StreamingResponse(_chat_events(first, updates, job, request, ChatStream(model, served.chat), start),
                                     media_type="text/event-stream")
        result = await _wait(job, request)
        return chat_body(model, result, _chat_done(result, start))

    def _chat_done(result, start: float) -> dict:
        """The completion's figures, counted in the metrics."""
        latency = time.perf_counter() - start
        figures = {**tandem_figures(result.completion_tokens, result.main_calls, result.drafted, result.accepted,
                                    result.decoder_seconds), "latency_seconds": round(latency, 4)}
        metrics.decoded("chat", result.completion_tokens, result.main_calls, result.drafted, result.accepted)
        metrics.latency.labels("chat").observe(latency)
        metrics.requests.labels("chat", "200").inc()
        return figures

    def _chat_events(first, updates: Updates, job: Job, request: Request, chunks: ChatStream, start: float):
        """``chat.completion.chunk`` events: the role, the text as the engine accepts tokens (round by round),
        the finish reason with the usage and figures, ``[DONE]``."""
        return _events([chunks.role()], first, updates, job, request, lambda new: [e for e in [chunks.tokens(new)] if e],
                       lambda result: chunks.finish(result, _chat_done(result, start)))

    return app


def _model_row(name: str, pair) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "tandem",
            "tandem": {"pair": pair.name, "task": pair.task, "main": str(pair.main),
                       "assistant": str(pair.assistant) if pair.assistant else None, "draft": pair.draft}}


def _asr_options(served: Served, task: str, language: str | None, prompt: str | None, response_format: str,
                 temperature: float, granularities: list[str] | None, stream: bool | None) -> TranscribeOptions:
    """The request's TranscribeOptions (the scheduler's batching key); APIError 400 for a parameter it
    cannot take."""
    if response_format not in RESPONSE_FORMATS:
        raise APIError(400, f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, not {response_format!r}",
                       "response_format")
    if not 0 <= temperature <= 1:
        raise APIError(400, f"temperature must be from 0 to 1, not {temperature}", "temperature")
    bad = [g for g in granularities or () if g not in ("segment", "word")]
    if bad:
        raise APIError(400, f"timestamp_granularities must be segment and/or word, not {bad[0]!r}",
                       "timestamp_granularities[]")
    words = "word" in (granularities or ())
    if words and response_format != "verbose_json":  # OpenAI's rule: the words are a verbose_json field
        raise APIError(400, f"timestamp_granularities word needs response_format verbose_json, not "
                       f"{response_format!r}", "timestamp_granularities[]")
    if stream and response_format not in ("json", "text"):
        raise APIError(400, f"stream needs response_format json or text (the events carry text), not "
                       f"{response_format!r}", "stream")
    language = (language or "").strip().lower() or None
    extra = {}
    if prompt:
        if "initial_prompt" not in {f.name for f in dataclasses.fields(TranscribeOptions)}:
            raise APIError(400, "prompt is not supported by this version", "prompt")
        extra["initial_prompt"] = prompt
    try:
        return TranscribeOptions(
            language=None if language == "auto" else language, task=task, device=served.options.device,
            dtype=served.options.dtype, batch_size=served.options.max_batch, use_assistant=served.options.use_assistant,
            timestamps=response_format in TIMED_FORMATS, word_timestamps=words, **extra,
            **({"temperature": (float(temperature),)} if temperature > 0 else {}))
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def _chat_request(body: dict) -> tuple[ChatSettings, list, bool]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise APIError(400, "messages must be a list of objects with role and content", "messages")
    if body.get("n", 1) != 1:
        raise APIError(400, "n must be 1", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or DEFAULT_CHAT_TOKENS
    temperature, top_p, seed = body.get("temperature", 1.0), body.get("top_p", 1.0), body.get("seed")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise APIError(400, f"max_tokens must be a whole number of at least 1, not {max_tokens!r}", "max_tokens")
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise APIError(400, f"temperature must be from 0 to 2, not {temperature!r}", "temperature")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise APIError(400, f"top_p must be above 0 and at most 1, not {top_p!r}", "top_p")
    if seed is not None and not isinstance(seed, int):
        raise APIError(400, "seed must be a whole number", "seed")
    return ChatSettings(max_tokens, float(temperature), float(top_p), seed), messages, bool(body.get("stream"))


def _submit(scheduler: Scheduler, kind: str, key, payload, listener=None) -> Job:
    try:
        return scheduler.submit(kind, key, payload, listener)
    except SchedulerClosed as exc:
        raise APIError(503, str(exc), None, "shutting_down") from None


async def _events(head: list[str], item, updates: Updates, job: Job, request: Request, update, finish):
    """A streamed request's server-sent events: ``head``, then ``update(item)``'s for each update the worker
    reports (``item`` the first, already received), then ``finish(result)``'s, or an error event when the
    request failed. A client that goes away (the response closes this generator) cancels the request: its
    rows leave the batch at the next boundary."""
    try:
        for event in head:
            yield event
        while item is not DONE:
            for event in update(item):
                yield event
            item = await updates.get()
        try:
            events = finish(await _wait(job, request))
        except APIError as exc:
            events = [sse(exc.body())]
        for event in events:
            yield event
    finally:
        if not job.future.done():
            job.cancel()


def _done_events(transcript, deltas: TextDeltas, figures: dict) -> list[str]:
    """The last delta (what the windows' text lacked of the transcript's) and ``transcript.text.done``."""
    events = [sse({"type": "transcript.text.delta", "delta": rest, "logprobs": None})
              for rest in [deltas.finish(transcript.text)] if rest]
    return events + [sse({"type": "transcript.text.done", "text": transcript.text, "logprobs": None,
                          "tandem": figures})]


async def _next_update(updates: Updates, job: Job, request: Request):
    """The request's next update (``DONE`` once its future is); a client that goes away meanwhile cancels
    the request (APIError 499)."""
    getting = asyncio.ensure_future(updates.get())
    try:
        while True:
            done, _ = await asyncio.wait({getting}, timeout=0.5)
            if done:
                return getting.result()
            if await request.is_disconnected():
                job.cancel()
                raise APIError(499, "the client went away", None, "client_closed")
    except asyncio.CancelledError:  # the shutdown's grace period ran out: the rows leave too
        job.cancel()
        raise
    finally:
        getting.cancel()


async def _wait(job: Job, request: Request):
    """The request's result; a client that goes away cancels it (``Job.cancel``: dropped while queued,
    its rows leave the batch at the next boundary while decoding)."""
    waiting = asyncio.wrap_future(job.future)
    while True:
        try:
            done, _ = await asyncio.wait({waiting}, timeout=0.5)
        except asyncio.CancelledError:  # the shutdown's grace period ran out: the rows leave too
            job.cancel()
            raise
        if done:
            try:
                return waiting.result()
            except APIError:
                raise
            except RequestCancelled:
                raise APIError(499, "the client went away", None, "client_closed") from None
            except Exception as exc:  # noqa: BLE001 - the batch failed: the server goes on
                raise APIError(500, f"decoding failed: {type(exc).__name__}: {exc}", None, "server_error") from None
        if await request.is_disconnected():
            job.cancel()
            raise APIError(499, "the client went away", None, "client_closed")
