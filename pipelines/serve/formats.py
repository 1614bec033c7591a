"""OpenAI's response bodies: transcriptions in json, text, srt, vtt and verbose_json, chat completions
(whole; streamed chunks: ``stream.ChatStream``), and the ``tandem`` figures every response carries."""

from __future__ import annotations

import json
import time
import uuid

from ..asr import Transcript
from ..asr.outputs import format_srt, format_vtt
from ..languages import language_name

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
TIMED_FORMATS = ("srt", "vtt", "verbose_json")  # decoded with timestamp tokens, as tandem transcribe -f srt does


def tandem_figures(tokens: float, main_calls: float, drafted: float, accepted: float, decoder_seconds: float,
                   seconds: float | None = None) -> dict:
    """Tandem's own figures for one request (its share of the batches it was decoded in)."""
    figures = {"tokens": int(tokens), "main_calls": round(main_calls, 3),
               "tokens_per_main_call": round(tokens / main_calls, 3) if main_calls else None,
               "drafted": round(drafted, 3), "accepted": round(accepted, 3),
               "acceptance": round(accepted / drafted, 4) if drafted else None,
               "decoder_seconds": round(decoder_seconds, 4)}
    if seconds is not None:
        figures["seconds"] = round(seconds, 4)
    return figures


def transcript_figures(t: Transcript, latency: float) -> dict:
    return {**tandem_figures(t.tokens, t.main_calls, t.drafted, t.accepted, t.decode_seconds, t.seconds),
            "latency_seconds": round(latency, 4), "finish_reason": t.finish_reason}


def transcription_body(t: Transcript, fmt: str, task: str, figures: dict) -> tuple[str, str]:
    """(body, media type) of a transcription in ``fmt``; the text formats carry the figures in a header."""
    if fmt == "text":
        return t.text + "\n", "text/plain; charset=utf-8"
    if fmt == "srt":
        return format_srt(t.segments), "text/plain; charset=utf-8"
    if fmt == "vtt":
        return format_vtt(t.segments), "text/vtt; charset=utf-8"
    body: dict = {"text": t.text}
    if fmt == "verbose_json":
        body = {"task": task, "language": language_name(t.language).lower() if t.language else None,
                "duration": round(t.duration, 3), "text": t.text,
                "segments": [{"id": i, "seek": 0, "start": s.start, "end": s.end, "text": s.text, "tokens": [],
                              "temperature": s.temperature or 0.0, "avg_logprob": s.avg_logprob or 0.0,
                              "compression_ratio": s.compression_ratio or 0.0,
                              "no_speech_prob": s.no_speech_prob or 0.0} for i, s in enumerate(t.segments)]}
        if any(s.words for s in t.segments):  # asked for (timestamp_granularities word): OpenAI's words, no space
            body["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end}
                             for s in t.segments for w in s.words]
    body["usage"] = {"type": "duration", "seconds": round(t.duration, 3)}
    body["tandem"] = figures
    return json.dumps(body, ensure_ascii=False), "application/json"


def chat_body(model: str, result, figures: dict) -> dict:
    """A ``chat.completion`` object for one result (``chat.ChatResult``)."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                         "finish_reason": result.finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
                      "total_tokens": result.prompt_tokens + result.completion_tokens},
            "tandem": figures}
