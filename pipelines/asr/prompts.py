"""Text prompts before a window: ``initial_prompt``, ``hotwords`` and the previous windows' text
(``condition_on_previous_text``), with openai/whisper's and faster-whisper's semantics; and ``prefix``, text the
file's first window's transcript starts with.

A window's decoder input is ``[<|startofprev|> hotwords previous] <|startoftranscript|> <|lang|> <|task|>
[<|notimestamps|>] [prefix]`` (faster-whisper's ``get_prompt``): the prompt is a prefix the model reads as if it had
been said before; nobody reads its logits, so main model and assistant see the same prefix and the
engine's exactness does not depend on it. Sources: openai/whisper ``transcribe.py`` (``initial_prompt``,
``condition_on_previous_text``, ``prompt_reset_on_temperature``) and ``decoding.py`` (``_get_initial_tokens``:
the last ``n_text_ctx // 2 - 1`` prompt tokens); faster-whisper ``transcribe.py`` (``hotwords``, and ``prefix``:
the first window only, after ``<|0.00|>`` when decoding with timestamps, and part of the window's tokens, so of
its text; openai/whisper's ``decode`` leaves the prefix out of the tokens it returns).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import TandemError

MAX_PROMPT_TOKENS = 223  # Whisper's n_text_ctx // 2 - 1: a prompt keeps at most its last 223 tokens


class PromptTooLongError(TandemError, ValueError):
    """A text prompt (``initial_prompt``, ``hotwords``) or ``prefix`` longer than Whisper reads; the message says
    how long."""


def prompt_tokens(tokenizer, text: str | None) -> list[int]:
    """The tokens of a prompt text as whisper encodes it: a leading space, no special tokens."""
    if not text or not text.strip():
        return []
    return list(tokenizer.encode(" " + text.strip(), add_special_tokens=False))


def prefix_tokens(tokenizer, text: str | None, timestamp_begin: int | None) -> list[int]:
    """The tokens a window's transcript is made to start with (``prefix``; faster-whisper's ``get_prompt``): with
    timestamps (``timestamp_begin``: the id of <|0.00|>) that timestamp, then the text as whisper encodes it
    (``prompt_tokens``); [] for no text."""
    tokens = prompt_tokens(tokenizer, text)
    return [timestamp_begin, *tokens] if tokens and timestamp_begin is not None else tokens


@dataclass
class PromptHistory:
    """One file's text so far, as the next window's prompt sees it (``condition_on_previous_text``).

    Starts with ``initial_prompt``'s tokens; each kept window's text tokens are appended when conditioning is
    on; a window kept at a temperature above ``reset_on_temperature`` (or any window, conditioning off)
    starts the history anew after it, as whisper's ``prompt_reset_since`` does."""

    tokens: list[int] = field(default_factory=list)

    def add(self, window_tokens: list[int], temperature: float, condition: bool, reset_on_temperature: float) -> None:
        """Record a decoded window's text tokens (timestamps included, end of text excluded)."""
        if condition and temperature <= reset_on_temperature:
            self.tokens += window_tokens
        else:
            self.tokens = []


def window_prompt(sot_sequence: list[int], sot_prev: int | None, hotwords: list[int],
                  previous: list[int]) -> list[int]:
    """The decoder prompt of one window: ``[<|startofprev|> hotwords previous[-223:]] + sot_sequence``; the
    hotwords are cut to 223 tokens first and the previous text fills what is left of the 223."""
    if sot_prev is None or not (hotwords or previous):
        return list(sot_sequence)
    hot = hotwords[:MAX_PROMPT_TOKENS]
    room = MAX_PROMPT_TOKENS - len(hot)
    prev = previous[-room:] if room > 0 else []
    return [sot_prev, *hot, *prev, *sot_sequence]
