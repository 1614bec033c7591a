"""Whisper's safeguards against invented text (openai/whisper ``transcribe()``, same names and defaults):

no_speech_threshold (0.6)          p(<|nospeech|>) at the first decoding step (the logits after
                                   <|startoftranscript|>); a window above it whose avg_logprob is also
                                   below logprob_threshold is silence: skipped, no text
logprob_threshold (-1.0)           avg_logprob = sum of log p(token) over the window's tokens (EOT
                                   included) / (tokens + 1); below it, decode again hotter
compression_ratio_threshold (2.4)  len(text) / len(zlib(text)) in bytes; above it the text repeats itself:
                                   decode again hotter
temperature (0, 0.2, ..., 1.0)     the first decodes greedily; each fallback samples at the next one
                                   through the engine's speculative sampling (exact: the main model's own
                                   distribution), so retries are assisted too

After the last temperature, a window whose text still repeats itself or is still unlikely (the fallback
conditions) is dropped and flagged rather than written (openai/whisper would keep the hottest decode): a
loop, or the invented sentence a tone or a chirp draws out at temperature 1, is never output. A segment
kept although p(no speech) was above its threshold (its text was confident) is flagged ``no_speech``. Tandem decodes every window
without the previous window's text as a prompt (faster-whisper's ``condition_on_previous_text=False``), so
no fallback can feed invented text into the next window. A clip shorter than ``MIN_AUDIO_SECONDS`` holds no
word: its transcript is empty. Any threshold set to None turns its check off; ``temperature=(0.0,)`` and
all three thresholds None decode exactly as without safeguards.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
MIN_AUDIO_SECONDS = 0.1  # shorter than the shortest word: nothing to transcribe


@dataclass(frozen=True)
class WindowVerdict:
    """What the safeguards made of one decoded window."""

    tokens: tuple[int, ...]  # the kept decode's tokens (empty when skipped or dropped)
    temperature: float  # of the kept decode
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float | None
    skipped: bool = False  # silence: p(no speech) above its threshold and a low avg_logprob
    dropped: bool = False  # still repetitive or unlikely at the last temperature: not written
    retried: int = 0  # fallback decodes made
    reason: str = ""  # when dropped: why, in a few words (``drop_reason``)


def compression_ratio(text: str) -> float:
    """len(text) / len(zlib.compress(text)), in UTF-8 bytes (Whisper's ``get_compression_ratio``)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def avg_logprob(sum_logprob: float, tokens: list[int], eot: int) -> float:
    """Whisper's average: the sum over the tokens (EOT included) / (tokens without EOT + 1)."""
    return sum_logprob / (len([t for t in tokens if t != eot]) + 1)


def needs_fallback(ratio: float, logprob: float, no_speech: float | None, options) -> bool:
    """Too repetitive or too unlikely, unless it is silence (Whisper's ``needs_fallback``)."""
    fallback = False
    if options.compression_ratio_threshold is not None and ratio > options.compression_ratio_threshold:
        fallback = True
    if options.logprob_threshold is not None and logprob < options.logprob_threshold:
        fallback = True
    if is_silence(no_speech, logprob, options):
        fallback = False
    return fallback


def is_silence(no_speech: float | None, logprob: float, options) -> bool:
    """p(no speech) above its threshold, unless the decode is confident (avg_logprob above its threshold)."""
    if options.no_speech_threshold is None or no_speech is None or no_speech <= options.no_speech_threshold:
        return False
    return not (options.logprob_threshold is not None and logprob > options.logprob_threshold)


def drop_reason(ratio: float, logprob: float, temperature: float, options) -> str:
    """Why a window is dropped, in a few words: "repetitive: compression ratio 3.10 > 2.4 at temperature 1.0",
    "unlikely: avg log-probability -1.42 < -1.0 at temperature 1.0" (both, joined, when both hold)."""
    why = []
    if options.compression_ratio_threshold is not None and ratio > options.compression_ratio_threshold:
        why.append(f"repetitive: compression ratio {ratio:.2f} > {options.compression_ratio_threshold}")
    if options.logprob_threshold is not None and logprob < options.logprob_threshold:
        why.append(f"unlikely: avg log-probability {logprob:.2f} < {options.logprob_threshold}")
    return "; ".join(why) + f" at temperature {temperature}"


def check_options(options) -> None:
    """Raise ValueError with a sentence for safeguard options out of range."""
    temps = options.temperature
    if not temps or any(not 0.0 <= t <= 2.0 for t in temps) or list(temps) != sorted(temps):
        raise ValueError(f"temperature must be one or more increasing values from 0 to 2, not {temps!r}")
    for name in ("compression_ratio_threshold", "no_speech_threshold"):
        value = getattr(options, name)
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be above 0 (or None to turn it off), not {value!r}")
    if options.no_speech_threshold is not None and options.no_speech_threshold > 1:
        raise ValueError(f"no_speech_threshold is a probability (0 to 1), not {options.no_speech_threshold!r}")


def decide(runner, enc, prompts: list[list[int]], timestamps: bool, options, seeds: list[int], first=None):
    """Decode encoded windows (``enc``, rows = windows) with the safeguards: greedily first, then the rows
    that need it at each next temperature (speculative sampling, seeded per window: ``seeds``). Returns a
    ``WindowVerdict`` per window, and every engine call as (rows it decoded, DecodeResult) for accounting.
    ``first``: the windows' first decode (at ``options.temperature[0]``, with the no-speech logits where
    ``no_speech_threshold`` asks for them) when it was already made, e.g. as rows of a continuous batch."""
    import torch

    from ..engine.rows import from_host

    eot = runner.model.generation_config.eos_token_id
    n = len(prompts)
    no_speech: list[float | None] = [None] * n
    verdicts: list[WindowVerdict | None] = [None] * n
    calls = []
    todo = list(range(n))
    temperatures = options.temperature
    for i, temperature in enumerate(temperatures):
        retry = []
        # greedy: the windows together; sampled: each window alone with its own seed, so that its draws depend
        # on its audio only, not on which windows share its batch (one generator serves a whole call)
        want_no_speech = i == 0 and options.no_speech_threshold is not None
        for rows in [todo] if temperature == 0 else [[r] for r in todo]:
            sub = enc if len(rows) == n else enc.select(from_host(rows, torch.long, enc.hidden.device))
            if i == 0 and first is not None:
                result = first
            else:
                result = runner.decode_encoded(sub, [prompts[r] for r in rows], timestamps, options, temperature,
                                               seed=None if temperature == 0 else seeds[rows[0]] + i,
                                               no_speech=want_no_speech)
            if want_no_speech:
                for r, p in zip(rows, runner.no_speech_probs(result)):
                    no_speech[r] = p
            calls.append((rows, result))
            retry += _judge(result, rows, temperature, i, no_speech, verdicts, runner, eot, options)
        todo = retry
        if not todo:
            break
    return verdicts, calls


def _judge(result, rows: list[int], temperature: float, i: int, no_speech: list[float | None],
           verdicts: list, runner, eot: int, options) -> list[int]:
    """Each decoded window's verdict into ``verdicts`` (skipped as silence, kept, or dropped after the last
    temperature); returns the windows to decode again at the next temperature."""
    from dataclasses import replace

    last = i == len(options.temperature) - 1
    retry = []
    for j, r in enumerate(rows):
        tokens = list(result.tokens[j])
        logprob = avg_logprob(result.sum_logprobs[j], tokens, eot)
        ratio = compression_ratio(runner.text_of(tokens))
        verdict = WindowVerdict(tuple(tokens), temperature, logprob, ratio, no_speech[r], retried=i)
        if is_silence(no_speech[r], logprob, options):
            verdict = replace(verdict, tokens=(), skipped=True)
        elif needs_fallback(ratio, logprob, no_speech[r], options) and not last:
            retry.append(r)
        elif needs_fallback(ratio, logprob, no_speech[r], options) and len(options.temperature) > 1:
            verdict = replace(verdict, tokens=(), dropped=True,  # a loop, or unlikely, even at the last temperature
                              reason=drop_reason(ratio, logprob, temperature, options))
        verdicts[r] = verdict
    return retry
