"""Speech recognition: audio files in, transcripts out (preprocess -> decode -> postprocess).

Decoding is the main model's plain greedy decoding for now (transformers ``generate``); the
assisted-decoding engine replaces it when it lands. Long files (over 30 s) use Whisper's sequential
long-form decoding with timestamps.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from .audio import SAMPLE_RATE, AudioDecodeError, is_audio_name, load_audio
from .loading import load_model, load_tokenizer
from .registry import Pair

WINDOW_SECONDS = 30.0  # Whisper's input window


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = "en"  # a language code ("en", "de", ...), or None to detect per file
    task: str = "transcribe"  # "transcribe" or "translate" (into English)
    dtype: str | None = None  # compute dtype; None takes the pair's
    max_new_tokens: int = 440  # per 30 s window (Whisper allows 448 positions including the prompt)


@dataclass(frozen=True)
class Transcript:
    path: str  # the input file
    text: str  # the transcript ("" for silence or on error)
    duration: float  # seconds of audio
    seconds: float  # wall time spent decoding this file
    error: str | None = None  # why the file failed, or None

    @property
    def ok(self) -> bool:
        return self.error is None


def find_audio(inputs: Iterable[str | Path]) -> list[Path]:
    """Expand files, folders (recursively, audio and video extensions only) and globs, in a stable order."""
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and is_audio_name(p))
        elif any(ch in str(item) for ch in "*?["):
            found += sorted(p for p in Path().glob(str(item)) if p.is_file())
        else:
            found.append(path)
    seen: set[Path] = set()
    return [p for p in found if not (p in seen or seen.add(p))]


class WhisperRunner:
    """Holds one pair's main model, tokenizer and feature extractor; never mutated per request."""

    def __init__(self, pair: Pair, dtype: str | None = None) -> None:
        import torch
        from transformers import WhisperFeatureExtractor

        from .loading import resolve

        self.pair = pair
        self.dtype = dtype or pair.dtype
        self.model = load_model(pair.main, self.dtype)
        self.tokenizer = load_tokenizer(pair.main)
        where, kwargs = resolve(pair.main)
        self.features = WhisperFeatureExtractor.from_pretrained(where, **kwargs)
        self._torch = torch

    @cached_property
    def multilingual(self) -> bool:
        return bool(getattr(self.model.generation_config, "is_multilingual", False))

    def _inputs(self, audio: np.ndarray):
        long = len(audio) > WINDOW_SECONDS * SAMPLE_RATE
        feats = self.features(
            audio, sampling_rate=SAMPLE_RATE, return_tensors="pt", truncation=not long,
            padding="longest" if long else "max_length", return_attention_mask=long,
        )
        x = feats.input_features.to(self.model.dtype)
        return x, (feats.attention_mask if long else None), long

    def decode(self, audio: np.ndarray, options: TranscribeOptions) -> str:
        """Plain greedy decoding of one file's samples."""
        if len(audio) == 0:
            return ""
        x, mask, long = self._inputs(audio)
        kwargs = dict(do_sample=False, num_beams=1, max_new_tokens=options.max_new_tokens)
        if self.multilingual:
            kwargs.update(task=options.task)
            if options.language:
                kwargs.update(language=options.language)
        if long:
            kwargs.update(attention_mask=mask, return_timestamps=True)
        with self._torch.inference_mode():
            out = self.model.generate(x, **kwargs)
        ids = out["sequences"] if isinstance(out, dict) else out
        return self.tokenizer.decode(ids[0], skip_special_tokens=True).strip()


def transcribe(paths: Iterable[str | Path], pair: Pair, options: TranscribeOptions = TranscribeOptions(),
               runner: WhisperRunner | None = None) -> Iterator[Transcript]:
    """Transcribe each file in turn; a file that cannot be decoded yields a Transcript with ``error`` set."""
    runner = runner or WhisperRunner(pair, options.dtype)
    for path in find_audio(paths):
        start = time.perf_counter()
        try:
            audio = load_audio(path)
        except AudioDecodeError as exc:
            yield Transcript(str(path), "", 0.0, time.perf_counter() - start, error=exc.reason)
            continue
        text = runner.decode(audio, options)
        yield Transcript(str(path), text, len(audio) / SAMPLE_RATE, time.perf_counter() - start)
