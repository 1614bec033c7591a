"""The server's scheduler: one worker thread owns the models; requests queue and are decoded in batches.

Transcriptions: the worker takes the oldest queued request, waits up to ``max_wait_ms`` for more requests
with the same decoding options (up to ``max_batch``), and decodes them together. With greedy options (the
default: temperature 0 first, no beam search) that is continuous batching (``asr.continuous``): every file's
30 s windows are rows of the engine's ``ContinuousBatch``, requests with the same options join the run at the
engine's round boundaries (``admit``), a window that finishes leaves its row at once and the file's next window
takes a slot in the next round, and each request's future is resolved the moment its file's last window is
done: a long file holds a short one back by no more than a round. Other options (sampling first, beam search)
go through ``asr.transcribe``, which admits at its step boundaries (one 30 s window of every file decoded to the
end). A queued request of other options (another language, task, format) stops admission, so the run drains
and that request goes next.

Chat completions: the queued chat requests with the same sampling settings and token budget, up to
``max_batch``, go through one engine call (rows of different prompt lengths).

A request cancelled (its client went away: ``Job.cancel``) is dropped while queued; a transcription already
decoding leaves the run at the next round (continuous) or step boundary (``watch``), a chat completion at the
engine's next round (``generate(on_round=...)``), its future failing with RequestCancelled. The same hooks
hand each round's or step's new segments, each round's new tokens, to the request's listener (streaming).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..asr import TranscribeOptions, Transcript, transcribe
from ..asr.continuous import supports, transcribe_continuously
from ..errors import TandemError


@dataclass
class Job:
    """One request in the scheduler. ``listener``, when set, is told the request's partial output from the
    worker thread: asr, each step's new segments (``tuple[Segment, ...]``); chat, each round's new tokens."""

    kind: str  # "asr" or "chat"
    key: object  # what must be equal for jobs to share a batch (asr: the TranscribeOptions)
    payload: object  # asr: the audio file (Path); chat: the prompt's token ids
    listener: Callable[[object], None] | None = None
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.monotonic)
    cancelled: bool = False

    def cancel(self) -> None:
        """The client went away: a queued request is dropped; a decoding one's rows leave the batch at the
        next boundary (asr: the next engine round, or the next step without continuous batching; chat: the next
        engine round), and its future gets RequestCancelled."""
        self.cancelled = True
        self.future.cancel()  # False once running: the worker then reads ``cancelled``

    def tell(self, update) -> None:
        if self.listener is not None:
            self.listener(update)


class SchedulerClosed(TandemError, RuntimeError):
    """The server is shutting down: no new requests."""


class RequestCancelled(TandemError, RuntimeError):
    """The request's client went away while its rows were decoding: they left the batch."""


class Scheduler:
    """Queues requests for one worker thread, which runs them in batches (module docstring).

    ``asr``: ``(runner, pair)`` of the loaded speech pair, or None; ``chat``: a callable decoding a list of
    prompts with one key's settings (``chat.ChatEngine.complete``), or None. ``on_batch(kind, rows)`` is told
    every batch started (metrics)."""

    def __init__(self, asr=None, chat: Callable | None = None, max_batch: int = 8, max_wait_ms: float = 10.0,
                 on_batch: Callable[[str, int], None] | None = None) -> None:
        self.asr, self.chat = asr, chat
        self.max_batch, self.max_wait = max_batch, max_wait_ms / 1000
        self.on_batch = on_batch or (lambda kind, rows: None)
        self._jobs: list[Job] = []
        self._cond = threading.Condition()
        self._closing = False
        self.running = 0  # requests whose rows are being decoded now
        self._thread = threading.Thread(target=self._work, name="tandem-scheduler", daemon=True)

    # -- the request side (any thread)
    def start(self) -> None:
        self._thread.start()

    def submit(self, kind: str, key, payload, listener: Callable[[object], None] | None = None) -> Job:
        """Queue one request; its job's future gets a Transcript (asr) or a chat result, or the exception that
        failed its batch (RequestCancelled after ``job.cancel()``). SchedulerClosed once ``close`` has begun."""
        job = Job(kind, key, payload, listener)
        with self._cond:
            if self._closing:
                raise SchedulerClosed("the server is shutting down")
            self._jobs.append(job)
            self._cond.notify_all()
        return job

    @property
    def queued(self) -> int:
        with self._cond:
            return sum(not j.future.cancelled() for j in self._jobs)

    def close(self, timeout: float | None = None) -> bool:
        """Take no more requests, finish the queued and running ones, stop the worker; False when the worker
        was still busy after ``timeout`` seconds."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the worker
    def _take(self, match: Callable[[Job], bool], room: int) -> list[Job]:
        """Up to ``room`` queued jobs that ``match``, oldest first, marked running (cancelled ones dropped).
        Called with the lock held."""
        taken, kept = [], []
        for job in self._jobs:
            if len(taken) < room and match(job):
                if job.future.set_running_or_notify_cancel():
                    taken.append(job)
            else:
                kept.append(job)
        self._jobs[:] = kept
        return taken

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closing:
                    self._cond.wait()
                if not self._jobs:
                    return  # closing, nothing left
                first = self._jobs[0]
                same = lambda j, f=first: j.kind == f.kind and j.key == f.key  # noqa: E731
                deadline = first.enqueued + self.max_wait
                while (sum(map(same, self._jobs)) < self.max_batch and not self._closing
                       and (wait := deadline - time.monotonic()) > 0):
                    self._cond.wait(wait)
                jobs = self._take(same, self.max_batch)
            if not jobs:
                continue
            try:
                if first.kind == "asr":
                    self._run_asr(first.key, jobs)
                else:
                    self._run_chat(first.key, jobs)
            except BaseException as exc:  # noqa: BLE001 - the batch's requests get the error; the worker goes on
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
            finally:
                self.running = 0

    def _run_asr(self, key: TranscribeOptions, jobs: list[Job]) -> None:
        running: dict[str, Job] = {}

        def admit(room: int) -> list[Path]:
            if jobs:  # the batch the run starts with
                new, jobs[:] = list(jobs), []
            else:
                with self._cond:
                    oldest = next((j for j in self._jobs if not j.future.cancelled()), None)
                    if oldest is not None and (oldest.kind != "asr" or oldest.key != key):
                        return []  # another kind of request waits: let this run drain
                    new = self._take(lambda j: j.kind == "asr" and j.key == key, room)
            for job in new:
                running[str(job.payload)] = job
            self.running = len(running)
            if new:
                self.on_batch("asr", len(new))
            return [job.payload for job in new]

        def watch(path: str, segments: tuple) -> bool:
            job = running.get(path)
            if job is None:
                return True
            if job.cancelled:  # its rows leave the run at this boundary
                del running[path]
                self.running = len(running)
                job.future.set_exception(RequestCancelled("the client went away"))
                return False
            if segments:
                job.tell(segments)
            return True

        runner, pair = self.asr
        try:
            run = transcribe_continuously if supports(key) else transcribe
            for result in run([], pair, replace(key, batch_size=self.max_batch), runner=runner, admit=admit, watch=watch):
                job = running.pop(result.path, None)
                self.running = len(running)
                if job is not None:
                    job.future.set_result(result)
        except BaseException as exc:  # noqa: BLE001
            for job in running.values():
                job.future.set_exception(exc)
            raise

    def _run_chat(self, key, jobs: list[Job]) -> None:
        self.running = len(jobs)
        self.on_batch("chat", len(jobs))

        def on_tokens(row: int, tokens: list[int]) -> bool:
            job = jobs[row]
            if job.cancelled:  # its row leaves the batch at this round boundary
                if not job.future.done():
                    job.future.set_exception(RequestCancelled("the client went away"))
                    self.running -= 1
                return False
            job.tell(tokens)
            return True

        results = self.chat([job.payload for job in jobs], key, on_tokens)
        for job, result in zip(jobs, results):
            if not job.future.done():
                job.future.set_result(result)


def result_of(transcript: Transcript) -> Transcript:
    """The transcript, or AudioError when its file could not be decoded (the request's fault: 400)."""
    if transcript.error:
        raise AudioError(transcript.error)
    return transcript


class AudioError(TandemError, ValueError):
    """The uploaded file is not audio the server can decode."""
