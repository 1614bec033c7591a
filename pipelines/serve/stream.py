"""Server-sent events: a request's partial output, as the worker thread produces it, turned into the text
deltas OpenAI streams (``transcript.text.delta`` / ``.done`` for audio, ``chat.completion.chunk`` for chat).

``Updates`` carries what the worker reports (a window's segments, a round's tokens) to the event loop;
``TextDeltas`` turns a growing text into deltas that join to exactly the final text; ``ChatStream`` makes
a streamed completion's chunks.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

DONE = object()  # put on an Updates queue when the request's future is done


def sse(event: dict | str) -> str:
    """One server-sent event: ``data: JSON`` and a blank line (OpenAI sends no ``event:`` field)."""
    return f"data: {event if isinstance(event, str) else json.dumps(event, ensure_ascii=False)}\n\n"


class Updates:
    """A request's updates, from the worker thread to the event loop: ``put`` from any thread (called in
    order: the worker's reports, then ``DONE`` from the future's callback), ``get`` in the loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def done(self, _future=None) -> None:
        self.put(DONE)

    async def get(self):
        return await self.queue.get()


class TextDeltas:
    """Deltas of a text that grows (a transcript window by window, a completion round by round) whose final
    form is stripped. Partial text is stripped too, and a partial that ends in U+FFFD (half a UTF-8
    character, a byte-level token cut) is held back; what was sent is always a prefix of the final text
    when every partial is (``finish`` sends the rest).

        feed(partial) -> partial.strip()[len(sent):] when sent is its prefix, else ""
        finish(final) -> final[len(sent):]  (sent + every delta == final)
    """

    def __init__(self) -> None:
        self.sent = ""

    def feed(self, partial: str) -> str:
        text = partial.strip()
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def finish(self, final: str) -> str:
        """The rest of ``final``; "" when the deltas sent are not its prefix (they cannot be taken back: a
        client should then read the done event's text)."""
        return final[len(self.sent):] if final.startswith(self.sent) else ""


class ChatStream:
    """The ``chat.completion.chunk`` events of one streamed completion: ``role()`` first, ``tokens(new)`` as
    rounds accept tokens (the completion so far decoded again, its new text sent), ``finish(result,
    figures)`` last (the rest of the text, the finish reason with the usage and Tandem's figures,
    ``[DONE]``). ``engine``: the ``chat.ChatEngine`` (its tokenizer)."""

    def __init__(self, model: str, engine) -> None:
        self.head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model}
        self.tokenizer, self.ids, self.deltas = engine.runner.tok, [], TextDeltas()

    def chunk(self, delta: dict, finish: str | None = None, **extra) -> str:
        return sse({**self.head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                              "logprobs": None}], **extra})

    def role(self) -> str:
        return self.chunk({"role": "assistant", "content": ""})

    def tokens(self, new: list[int]) -> str | None:
        self.ids += new
        delta = self.deltas.feed(self.tokenizer.decode(self.ids, skip_special_tokens=True))
        return self.chunk({"content": delta}) if delta else None

    def finish(self, result, figures: dict) -> list[str]:
        """``result``: the row's ``chat.ChatResult``."""
        rest = self.deltas.finish(result.text)
        usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
                 "total_tokens": result.prompt_tokens + result.completion_tokens}
        return ([self.chunk({"content": rest})] if rest else []) + [
            self.chunk({}, result.finish_reason, usage=usage, tandem=figures), sse("[DONE]")]
