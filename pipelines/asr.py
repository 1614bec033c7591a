"""Speech recognition: audio files in, transcripts out (preprocess -> decode -> postprocess).

preprocess   decode the file to 16 kHz mono, log-mel features of one 30 s window
decode       Tandem's engine: the pair's assistant drafts, Whisper verifies (or plain decoding)
postprocess  tokens to text

Files longer than 30 s still go through transformers' sequential long-form decoding (plain, with
timestamps) until the long-form ASR pipeline lands.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from .audio import SAMPLE_RATE, AudioDecodeError, is_audio_name, load_audio
from .engine import DecodeOptions, DecodeStats, rules_from_generation_config
from .pairs import load_pair
from .registry import Pair

WINDOW_SECONDS = 30.0  # Whisper's input window


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = "en"  # a language code ("en", "de", ...), or None to detect per file
    task: str = "transcribe"  # "transcribe" or "translate" (into English)
    dtype: str | None = None  # compute dtype; None takes the pair's
    max_new_tokens: int = 440  # per 30 s window (Whisper allows 448 positions including the prompt)
    use_assistant: bool = True  # False: plain decoding with the same main model
    compare: bool = False  # also decode plainly, to time it and check the outputs are identical


@dataclass(frozen=True)
class Transcript:
    path: str  # the input file
    text: str  # the transcript ("" for silence or on error)
    duration: float  # seconds of audio
    seconds: float  # wall time spent decoding this file
    error: str | None = None  # why the file failed, or None
    stats: DecodeStats | None = None  # engine statistics (None for the long-form path)
    plain_seconds: float | None = None  # with compare: plain decoding's time for the same audio
    identical: bool | None = None  # with compare: assisted tokens == plain tokens

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
    """Holds one pair's models, tokenizer and feature extractor; never mutated per request."""

    def __init__(self, pair: Pair, dtype: str | None = None) -> None:
        import torch
        from transformers import WhisperFeatureExtractor

        from .loading import resolve

        self.pair = pair
        self.loaded = load_pair(pair, dtype)
        self.model = self.loaded.main_model
        self.tokenizer = self.loaded.tokenizer
        where, kwargs = resolve(pair.main)
        self.features = WhisperFeatureExtractor.from_pretrained(where, **kwargs)
        self._torch = torch

    @cached_property
    def multilingual(self) -> bool:
        return bool(getattr(self.model.generation_config, "is_multilingual", False))

    def prompt(self, language: str | None, task: str, features) -> list[int]:
        """<|startoftranscript|> [<|lang|> <|task|>] <|notimestamps|>; the language is detected when None."""
        gen = self.model.generation_config
        tokens = [gen.decoder_start_token_id]
        if self.multilingual:
            if language is None:
                with self._torch.inference_mode():
                    lang_id = int(self.model.detect_language(features)[0])
            else:
                key = f"<|{language}|>"
                if key not in gen.lang_to_id:
                    raise ValueError(f"language {language!r} is not one this model knows")
                lang_id = gen.lang_to_id[key]
            tokens += [lang_id, gen.task_to_id[task]]
        return tokens + [gen.no_timestamps_token_id]

    def _long_form(self, audio: np.ndarray, options: TranscribeOptions) -> str:
        feats = self.features(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt", truncation=False,
                              padding="longest", return_attention_mask=True)
        kwargs = dict(do_sample=False, num_beams=1, attention_mask=feats.attention_mask, return_timestamps=True)
        if self.multilingual:
            kwargs.update(task=options.task, **({"language": options.language} if options.language else {}))
        with self._torch.inference_mode():
            out = self.model.generate(feats.input_features.to(self.model.dtype), **kwargs)
        ids = out["sequences"] if isinstance(out, dict) else out
        return self.tokenizer.decode(ids[0], skip_special_tokens=True).strip()

    def decode(self, audio: np.ndarray, options: TranscribeOptions) -> tuple[str, DecodeStats | None, dict]:
        """Greedy decoding of one file's samples: text, engine stats, and the compare figures."""
        if len(audio) == 0:
            return "", None, {}
        if len(audio) > WINDOW_SECONDS * SAMPLE_RATE:
            return self._long_form(audio, options), None, {}
        x = self.features(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features.to(self.model.dtype)
        prompt = self.prompt(options.language, options.task, x)
        rules = rules_from_generation_config(self.model.generation_config, len(prompt), options.max_new_tokens)
        decode_options = DecodeOptions(max_new_tokens=options.max_new_tokens)
        engine = self.loaded.engine if options.use_assistant else self.loaded.plain
        result = engine.generate([prompt], rules, decode_options, encoder_inputs={"input_features": x})
        compare = {}
        if options.compare:
            plain = self.loaded.plain.generate([prompt], rules, decode_options, encoder_inputs={"input_features": x})
            compare = {"plain_seconds": plain.stats.total_s, "identical": plain.tokens == result.tokens}
        text = self.tokenizer.decode(list(result.tokens[0]), skip_special_tokens=True).strip()
        return text, result.stats, compare


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
        text, stats, compare = runner.decode(audio, options)
        seconds = stats.total_s if stats is not None else time.perf_counter() - start
        yield Transcript(str(path), text, len(audio) / SAMPLE_RATE, seconds, stats=stats, **compare)
