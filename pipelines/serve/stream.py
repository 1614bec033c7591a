"""Server-sent events: a request's partial output, as the worker thread produces it, turned into the text
deltas OpenAI streams (``transcript.text.delta`` / ``.done`` for audio, ``chat.completion.chunk`` for chat).

``Updates`` carries what the worker reports (a window's segments, a round's tokens) to the event loop;
``TextDeltas`` turns a growing text into deltas that join to exactly the final text.
"""

from __future__ import annotations

import asyncio
import json

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
