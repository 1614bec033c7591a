"""Speech recognition: audio files in, transcripts and segments out (preprocess -> decode -> postprocess).

preprocess   stream each file as 16 kHz mono, one 30 s window at a time (memory stays bounded)
decode       Tandem's engine on a batch of windows from different files (ragged batching): the pair's
             assistant drafts, Whisper verifies (or plain decoding)
postprocess  tokens to text and timed segments; the file's cursor moves to the next window

Long files are decoded window after window as Whisper does (OpenAI's sequential algorithm): with
timestamps on, a window ends at its last complete segment and the next window starts there. Or, with
``long_form="chunked"``, a long file is cut at pauses into chunks of 15-26 s (the last one up to 30 s) decoded
independently, several at a time (the chunks of one file then fill a batch; each chunk's segments are
offset by its start). The two modes can differ in wording at chunk edges; plain and assisted decoding give
the same tokens in either. A file of
one window without ``timestamps`` is decoded like ``generate()``'s short-form mode (no timestamp
tokens), so its tokens can be compared with it one for one. Silent windows are skipped (no
hallucinated text).
"""

from __future__ import annotations

import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from .audio import SAMPLE_RATE, AudioDecodeError, stream_audio
from .inputs import find_audio
from .engine import (
    DecodeOptions, DecodeStats, EncoderOutput, PolicyOptions, Rules, Sampling, TimestampRules, rules_from_generation_config,
)
from .safeguards import MIN_AUDIO_SECONDS, TEMPERATURES, WindowVerdict, check_options, decide
from .pairs import load_pair
from .registry import Pair
from .vad import filter_speech, require_vad

WINDOW_SECONDS = 30.0  # Whisper's input window
WINDOW = int(WINDOW_SECONDS * SAMPLE_RATE)
TIME_PRECISION = 0.02  # seconds per timestamp token
SILENCE_RMS = 1e-4  # a window quieter than this (root mean square) is silence: nothing to decode
CHUNK_MIN_SECONDS = 15.0  # chunked long-form: a chunk cut at a pause is at least this long
CHUNK_MAX_SECONDS = 26.0  # and at most this long (speech in Whisper's last ~3 s is often left for the next window)
LONG_FORMS = ("sequential", "chunked")


class LanguageError(ValueError):
    """The pair's model cannot take the asked language or task (e.g. German on an English-only model)."""


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = "en"  # a language code ("en", "de", ...), or None to detect per file
    task: str = "transcribe"  # "transcribe" or "translate" (into English)
    dtype: str | None = None  # compute dtype; None takes the pair's
    max_new_tokens: int = 440  # per 30 s window (Whisper allows 448 positions including the prompt)
    use_assistant: bool = True  # False: plain decoding with the same main model
    compare: bool = False  # also decode plainly, to time it and check the outputs are identical
    batch_size: int = 4  # windows of different files decoded together
    timestamps: bool = False  # timestamp tokens even for files of one window (always on for longer files)
    policy: PolicyOptions = PolicyOptions()  # how many tokens the assistant drafts each round
    long_form: str = "sequential"  # files over 30 s: "sequential" (Whisper's seek) or "chunked" (cut at pauses, batched)
    # Whisper's safeguards (see pipelines/safeguards.py; None turns a check off)
    temperature: tuple[float, ...] = TEMPERATURES  # the first decodes greedily, each fallback samples at the next
    compression_ratio_threshold: float | None = 2.4  # text more repetitive than this: fall back
    logprob_threshold: float | None = -1.0  # average log-probability below this: fall back
    no_speech_threshold: float | None = 0.6  # p(no speech) above this (and a low avg_logprob): silence, skipped
    vad_filter: bool = False  # Silero VAD first: audio outside speech set to zero, not decoded (pipelines/vad.py)

    def __post_init__(self) -> None:
        check_options(self)
        if self.long_form not in LONG_FORMS:
            raise ValueError(f"long_form must be one of {', '.join(LONG_FORMS)}, not {self.long_form!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {self.batch_size}")


@dataclass(frozen=True)
class Segment:
    start: float  # seconds from the start of the file
    end: float
    text: str
    avg_logprob: float | None = None  # of the window it came from (safeguards.avg_logprob)
    no_speech_prob: float | None = None  # p(no speech) at the window's first decoding step
    compression_ratio: float | None = None  # of the window's text
    temperature: float | None = None  # of the window's kept decode (above 0: a fallback)
    no_speech: bool = False  # p(no speech) was above no_speech_threshold; kept because the text was confident


@dataclass(frozen=True)
class Transcript:
    path: str  # the input file
    text: str  # the transcript ("" for silence or on error)
    duration: float  # seconds of audio
    seconds: float  # wall time spent decoding this file's windows (its share of each batch)
    error: str | None = None  # why the file failed, or None
    segments: tuple[Segment, ...] = ()
    language: str | None = None
    tokens: int = 0  # tokens emitted
    main_calls: float = 0.0  # main-model passes this file's windows took part in (its share of each batch's)
    drafted: float = 0.0  # draft tokens proposed (its share)
    accepted: float = 0.0  # draft tokens accepted (its share)
    decode_seconds: float = 0.0  # decoder time, encoder excluded (its share)
    plain_seconds: float | None = None  # with compare: plain decoder time for the same windows
    identical: bool | None = None  # with compare: assisted tokens == plain tokens in every window
    retried: int = 0  # windows decoded again at a higher temperature (safeguards)
    skipped: int = 0  # windows skipped as silence (no_speech_threshold)
    dropped: int = 0  # windows dropped: still repetitive or unlikely at the last temperature
    accepted_hist: dict[int, int] = field(default_factory=dict)  # drafts accepted in a round -> rounds (of the
    #                                                              batches the file took part in; exact for one file)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Progress:
    """Where a ``transcribe`` call stands, reported after each decoding step (``transcribe(progress=...)``)."""

    windows: int  # 30 s windows (or chunks) decoded so far, all files
    files_done: int  # files decoded to the end
    audio_done: float  # seconds of audio decoded so far: finished files, and the active files up to their cursor
    audio_known: float  # seconds of audio read so far (a file counts in full once read to its end)
    elapsed: float  # seconds since the call started


class WindowReader:
    """Streams a file and serves 30 s windows from any later start; samples before it are dropped."""

    def __init__(self, path: Path) -> None:
        self._blocks = stream_audio(path, block_seconds=WINDOW_SECONDS)
        self._buf = np.zeros(0, dtype=np.float32)
        self._start = 0  # sample index of _buf[0]
        self._ended = False
        self._fill(WINDOW + 1)  # decode errors surface here, before any work is done

    def _fill(self, end: int) -> None:
        while not self._ended and self._start + len(self._buf) < end:
            try:
                self._buf = np.concatenate([self._buf, next(self._blocks)])
            except StopIteration:
                self._ended = True

    @property
    def known_length(self) -> int:
        """Samples read so far (the whole file once ``ended``)."""
        return self._start + len(self._buf)

    @property
    def ended(self) -> bool:
        return self._ended

    def window(self, start: int) -> np.ndarray:
        self._fill(start + WINDOW + 1)
        drop = max(0, start - self._start)
        self._buf, self._start = self._buf[drop:], self._start + drop
        return self._buf[: WINDOW]

    def is_single_window(self) -> bool:
        self._fill(WINDOW + 1)
        return self._ended and self.known_length <= WINDOW


@dataclass
class _Cursor:
    """One file being decoded: where it is and what it has produced."""

    path: Path
    reader: WindowReader
    single: bool  # the file fits one window
    seek: int = 0  # sample where the next window starts
    segments: list[Segment] = field(default_factory=list)
    language: str | None = None
    prompt: list[int] | None = None
    seconds: float = 0.0
    decode_seconds: float = 0.0
    plain_seconds: float = 0.0
    identical: bool = True
    tokens: int = 0
    main_calls: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0
    done: bool = False
    retried: int = 0
    skipped: int = 0
    dropped: int = 0
    hist: Counter = field(default_factory=Counter)  # accepted drafts per round -> rounds
    leftovers: list[tuple[int, np.ndarray]] = field(default_factory=list)  # chunked: (start, samples) to redo


def segments_from_tokens(tokens: list[int], timestamp_begin: int, offset: float, window_seconds: float,
                         decode) -> tuple[list[Segment], float]:
    """Whisper's timestamp tokens -> segments, and how far to advance (seconds).

    Consecutive timestamp pairs close one segment and open the next. If the window ends with a complete
    segment (two timestamps in a row), the next window starts at the last timestamp; if it ends with a
    single timestamp (nothing more was said), the whole window is consumed."""
    is_ts = [t >= timestamp_begin for t in tokens]
    single_ending = len(tokens) >= 2 and is_ts[-2:] == [False, True]
    cuts = [i for i in range(1, len(tokens)) if is_ts[i] and is_ts[i - 1]]
    segments: list[Segment] = []
    if cuts:
        bounds = cuts + ([len(tokens)] if single_ending else [])
        last = 0
        for cut in bounds:
            piece = tokens[last:cut]
            if piece and piece[0] >= timestamp_begin:
                start = (piece[0] - timestamp_begin) * TIME_PRECISION
                end_tok = piece[-1] if piece[-1] >= timestamp_begin else piece[0]
                end = (end_tok - timestamp_begin) * TIME_PRECISION
                text = decode([t for t in piece if t < timestamp_begin]).strip()
                if text:
                    segments.append(Segment(round(offset + start, 2), round(offset + max(end, start), 2), text))
            last = cut
        if single_ending:
            advance = window_seconds
        else:
            advance = (tokens[cuts[-1] - 1] - timestamp_begin) * TIME_PRECISION
            advance = advance if advance > 0 else window_seconds
    else:
        stamps = [t for t in tokens if t >= timestamp_begin]
        end = (stamps[-1] - timestamp_begin) * TIME_PRECISION if stamps and stamps[-1] > timestamp_begin else window_seconds
        text = decode([t for t in tokens if t < timestamp_begin]).strip()
        if text:
            segments.append(Segment(round(offset, 2), round(offset + min(end, window_seconds), 2), text))
        advance = window_seconds
    return segments, advance


def frame_rms(audio: np.ndarray) -> np.ndarray:
    """Root mean square of each whole 10 ms frame, in ``audio``'s dtype."""
    hop = SAMPLE_RATE // 100
    n = len(audio) // hop
    return np.sqrt(np.mean(np.square(audio[: n * hop].reshape(n, hop)), axis=1))


def voiced_frames(audio: np.ndarray) -> np.ndarray:
    """Per 10 ms frame: louder than 5% of the window's loud frames (95th percentile RMS) and than 1e-3 RMS."""
    rms = frame_rms(audio)
    if len(rms) == 0:
        return np.zeros(0, dtype=bool)
    return rms > max(1e-3, 0.05 * float(np.percentile(rms, 95)))


def quiet_cut(window: np.ndarray, min_seconds: float = CHUNK_MIN_SECONDS, max_seconds: float = CHUNK_MAX_SECONDS) -> int:
    """Where to end a chunk that starts at ``window[0]`` when the file goes on past the window: in the
    middle of the latest of the quietest pauses after ``min_seconds`` (samples from the window's start).

    Frame energy r_i is the RMS of 10 ms frame i, smoothed over 21 frames: e_i = mean(r_{i-10..i+10}).
    Frames with e_i <= 1.5 * min(e) + 1e-4 between min_seconds and max_seconds (and 0.1 s before the
    window's end) are quiet; the cut goes mid-way through the last run of quiet frames (later = fewer,
    longer chunks)."""
    hop = SAMPLE_RATE // 100
    n = len(window) // hop
    lo, hi = int(min_seconds * 100), min(n - 10, int(max_seconds * 100))
    if hi <= lo:
        return len(window)
    energy = np.convolve(frame_rms(window.astype(np.float64)), np.ones(21) / 21, mode="same")[lo:hi]
    quiet = np.flatnonzero(energy <= 1.5 * float(energy.min()) + 1e-4)
    last = first = int(quiet[-1])
    while first > 0 and energy[first - 1] <= 1.5 * float(energy.min()) + 1e-4:
        first -= 1
    return (lo + (first + last) // 2) * hop


def tighten_segments(segments: list[Segment], voiced: np.ndarray, offset: float, margin: float = 0.1) -> list[Segment]:
    """Whisper's segments run from one timestamp to the next, pauses included. Move each start forward to
    the first voiced 10 ms frame in the segment and each end back to the last one (keeping ``margin``
    seconds), ``voiced`` being the window's ``voiced_frames``.
    Segments only ever shrink, and one with no voiced frame is left as it is."""
    n = len(voiced)
    if n == 0 or not segments:
        return segments
    out = []
    for seg in segments:
        a = max(0, int((seg.start - offset) * 100))
        b = min(n, int(np.ceil((seg.end - offset) * 100)))
        v = voiced[a:b].copy()
        idx = np.flatnonzero(v)
        if len(idx) == 0:
            out.append(seg)
            continue
        # The next sentence's first syllables often fall before the closing timestamp: drop a voiced
        # tail shorter than 0.3 s that follows a pause of at least 0.15 s.
        last = idx[-1]
        run_start = last
        while run_start > 0 and v[run_start - 1]:
            run_start -= 1
        gap_start = run_start
        while gap_start > 0 and not v[gap_start - 1]:
            gap_start -= 1
        if last - run_start + 1 < 30 and run_start - gap_start >= 15 and gap_start > 0:
            v[run_start:] = False
            idx = np.flatnonzero(v)
        start = max(seg.start, offset + (a + idx[0]) / 100 - margin)
        end = min(seg.end, offset + (a + idx[-1] + 1) / 100 + margin)
        out.append(Segment(round(start, 2), round(max(end, start), 2), seg.text))
    return out


_SENTENCE_END = __import__("re").compile(r"(?<=[.!?])\s+")


def split_at_pauses(segments: list[Segment], voiced: np.ndarray, offset: float, min_gap: float = 0.3,
                    margin: float = 0.1) -> list[Segment]:
    """Whisper sometimes puts several sentences in one segment. When a segment's audio has exactly as many
    voiced stretches (separated by pauses of ``min_gap`` seconds or more) as its text has sentences, give
    each sentence its own stretch; otherwise keep the segment. ``voiced``: the window's ``voiced_frames``."""
    n = len(voiced)
    if n == 0:
        return segments
    out: list[Segment] = []
    for seg in segments:
        sentences = [x for x in _SENTENCE_END.split(seg.text) if x.strip()]
        a = max(0, int((seg.start - offset) * 100))
        b = min(n, int(np.ceil((seg.end - offset) * 100)))
        regions, run_start, silent = [], None, 0
        for i in range(a, b):
            if voiced[i]:
                if run_start is None:
                    run_start = i
                elif silent >= min_gap * 100:
                    regions.append([run_start, i - silent])
                    run_start = i
                silent = 0
            else:
                silent += 1
        if run_start is not None:
            regions.append([run_start, b - silent])
        if len(sentences) > 1 and len(regions) == len(sentences):
            for (r0, r1), text in zip(regions, sentences):
                start = max(seg.start, offset + r0 / 100 - margin)
                end = min(seg.end, offset + r1 / 100 + margin)
                out.append(Segment(round(start, 2), round(end, 2), text.strip()))
        else:
            out.append(seg)
    return out


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
        """False for an English-only (``.en``) model: no language or task token, language always English."""
        return bool(getattr(self.model.generation_config, "is_multilingual", False))

    def check_language(self, options: TranscribeOptions) -> None:
        """Raise LanguageError (one sentence) when the model cannot do what ``options`` ask: an English-only
        model given a language other than English (or None, which it takes as English) or the translate
        task, a multilingual model given a language it has no token for."""
        name = self.pair.name
        if not self.multilingual:
            if options.language not in (None, "en"):
                raise LanguageError(f"pair {name!r} is English-only: the language must be en or auto, "
                                    f"not {options.language!r} (choose a multilingual pair)")
            if options.task != "transcribe":
                raise LanguageError(f"pair {name!r} is English-only: it cannot {options.task} (choose a multilingual pair)")
        elif options.language is not None and f"<|{options.language}|>" not in self.model.generation_config.lang_to_id:
            raise LanguageError(f"language {options.language!r} is not one pair {name!r} knows")

    @cached_property
    def timestamp_begin(self) -> int:
        return self.model.generation_config.no_timestamps_token_id + 1

    def encode(self, features):
        """The main encoder's output for these log-mel features (``feats``), (windows, frames, d_model)."""
        with self._torch.inference_mode():
            return self.loaded.plain.main.encode(input_features=features).hidden

    def language_of(self, hidden) -> str:
        """Whisper's language detection from one window's encoder output (``encode``), so that the
        window's encoder pass also serves its decoding."""
        from transformers.modeling_outputs import BaseModelOutput

        with self._torch.inference_mode():
            lang_id = int(self.model.detect_language(encoder_outputs=BaseModelOutput(last_hidden_state=hidden))[0])
        return self.tokenizer.convert_ids_to_tokens(lang_id)[2:-2]

    def prompt(self, language: str | None, task: str, timestamps: bool) -> list[int]:
        """<|startoftranscript|> [<|lang|> <|task|>] [<|notimestamps|>]."""
        gen = self.model.generation_config
        tokens = [gen.decoder_start_token_id]
        if self.multilingual:
            key = f"<|{language or 'en'}|>"
            if key not in gen.lang_to_id:
                raise ValueError(f"language {language!r} is not one this model knows")
            tokens += [gen.lang_to_id[key], gen.task_to_id[task]]
        return tokens if timestamps else tokens + [gen.no_timestamps_token_id]

    def rules(self, prompt_len: int, timestamps: bool, max_new: int) -> Rules:
        from dataclasses import replace

        rules = rules_from_generation_config(self.model.generation_config, prompt_len, max_new)
        if timestamps:
            rules = replace(rules, timestamps=TimestampRules.from_generation_config(self.model.generation_config, prompt_len))
        return rules

    def feats(self, windows: list[np.ndarray]):
        x = self.features(windows, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        return x.to(self.model.dtype)

    @cached_property
    def no_speech_id(self) -> int | None:
        """<|nospeech|> (<|nocaptions|> in the older vocabularies), or None when the model has neither."""
        vocab = self.tokenizer.get_vocab()
        return next((vocab[t] for t in ("<|nospeech|>", "<|nocaptions|>") if t in vocab), None)

    def encode_windows(self, windows: list[np.ndarray], encoded: list | None = None) -> tuple[EncoderOutput, float]:
        """The encoder output for ``windows`` (windows, frames, d_model), reusing the ones already computed
        (``encoded``: per window, a language detection's output or None), and the seconds it took."""
        start = time.perf_counter()
        x = self.feats(windows)
        encoded = encoded or [None] * len(windows)
        missing = [i for i, h in enumerate(encoded) if h is None]
        fresh = iter(self.encode(x[missing]) if missing else [])
        hidden = self._torch.stack([h if h is not None else next(fresh) for h in encoded])
        return EncoderOutput(hidden, None), time.perf_counter() - start

    def no_speech_probs(self, result) -> list[float | None]:
        """p(<|nospeech|>) at the first decoding step of each window (Whisper's no_speech_prob): the softmax
        of the main model's logits at <|startoftranscript|>, which the engine returns with the decode
        (``decode_encoded(..., no_speech=True)``)."""
        if self.no_speech_id is None or result.prompt_logits is None:
            return [None] * len(result.tokens)
        return self._torch.softmax(result.prompt_logits, dim=-1)[:, self.no_speech_id].tolist()

    def decode_encoded(self, enc: EncoderOutput, prompts: list[list[int]], timestamps: bool, options: TranscribeOptions,
                       temperature: float = 0.0, seed: int | None = None, no_speech: bool = False):
        """One engine call over encoded windows of several files (same prompt length): greedy at temperature 0
        (with compare, also plainly), else speculative sampling at ``temperature``. ``no_speech``: also return
        the logits at <|startoftranscript|> (``no_speech_probs``)."""
        rules = self.rules(len(prompts[0]), timestamps, options.max_new_tokens)
        sampled = temperature > 0
        decode_options = DecodeOptions(max_new_tokens=options.max_new_tokens, policy=options.policy, do_sample=sampled,
                                       sampling=Sampling(temperature=temperature) if sampled else Sampling(), seed=seed,
                                       compare_plain=options.compare and options.use_assistant and not sampled,
                                       logits_at=prompts[0].index(self.model.generation_config.decoder_start_token_id)
                                       if no_speech else None)
        engine = self.loaded.engine if options.use_assistant else self.loaded.plain
        return engine.generate(prompts, rules, decode_options, encoder_output=enc)

    def text_of(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True).strip()


def _open(path: Path, options: TranscribeOptions) -> _Cursor:
    reader = WindowReader(path)
    return _Cursor(path, reader, single=reader.is_single_window() and not options.timestamps)


def _finish(cur: _Cursor, compare: bool) -> Transcript:
    cur.segments.sort(key=lambda seg: seg.start)  # chunked mode may decode a leftover after later chunks
    text = " ".join(s.text for s in cur.segments).strip()
    return Transcript(
        str(cur.path), text, cur.reader.known_length / SAMPLE_RATE, cur.seconds, None, tuple(cur.segments),
        cur.language, cur.tokens, cur.main_calls, cur.drafted, cur.accepted, cur.decode_seconds,
        cur.plain_seconds if compare else None, cur.identical if compare else None, cur.retried, cur.skipped, cur.dropped,
        dict(sorted(cur.hist.items())),
    )


def _in_chunks(cur: _Cursor, options: TranscribeOptions) -> bool:
    """Whether this file is cut into independent chunks (chunked mode, longer than one window)."""
    return options.long_form == "chunked" and not cur.single


def _next_chunk(cur: _Cursor, options: TranscribeOptions) -> tuple[int, np.ndarray] | None:
    """The cursor's next piece of audio to decode: (start sample, samples), or None when the file is done.
    Sequential mode gives the 30 s window at the seek (the seek moves after decoding, by the timestamps);
    chunked mode cuts the window at a pause (``quiet_cut``) and moves the seek past it now."""
    if cur.leftovers:
        return cur.leftovers.pop(0)
    audio = cur.reader.window(cur.seek)
    if len(audio) == 0:
        return None
    start = cur.seek
    if _in_chunks(cur, options):
        last = cur.reader.ended and start + len(audio) >= cur.reader.known_length
        audio = audio if last else audio[: quiet_cut(audio)]
        cur.seek += len(audio)
    return start, audio


def _is_silent(audio: np.ndarray) -> bool:
    return float(np.sqrt(np.mean(np.square(audio)))) < SILENCE_RMS


@dataclass(frozen=True)
class _Piece:
    """Audio of one file to decode in this step."""

    cursor: _Cursor
    start: int  # sample of the file where it starts
    audio: np.ndarray
    encoded: object = None  # its encoder output when language detection already computed it


def _gather(runner: WhisperRunner, active: list[_Cursor], options: TranscribeOptions) -> dict[bool, list[_Piece]]:
    """The pieces to decode in this step, by timestamp mode: one window per file (sequential), or in
    chunked mode as many chunks of the active files as fill the batch. Silent pieces are skipped. A
    file's first piece detects its language (``language=None``) and keeps that encoder output."""
    work: dict[bool, list[_Piece]] = {True: [], False: []}
    for cur in active:
        while not cur.done and sum(map(len, work.values())) < max(1, options.batch_size):
            piece = _next_chunk(cur, options)
            if piece is None:
                break
            start, audio = piece[0], filter_speech(piece[1], options.vad_filter)
            too_short = cur.reader.ended and cur.reader.known_length < MIN_AUDIO_SECONDS * SAMPLE_RATE
            if _is_silent(audio) or too_short:
                if not _in_chunks(cur, options):
                    cur.seek += len(audio)
                cur.done = cur.reader.ended and cur.seek >= cur.reader.known_length
                continue
            hidden = None
            if cur.prompt is None:
                if options.language is None and runner.multilingual:
                    hidden = runner.encode(runner.feats([audio]))[0]
                    cur.language = runner.language_of(hidden[None])
                else:
                    cur.language = options.language or "en"
                cur.prompt = runner.prompt(cur.language, options.task, timestamps=not cur.single)
            work[not cur.single].append(_Piece(cur, start, audio, hidden))
            if not _in_chunks(cur, options):
                break  # sequential: the next window depends on this one's timestamps
    return work


def _step(runner: WhisperRunner, active: list[_Cursor], options: TranscribeOptions) -> int:
    """Advance every active cursor: its next window (or chunks) decoded together with the other files',
    under Whisper's safeguards (``safeguards.decide``). Returns how many windows (or chunks) were decoded."""
    work = _gather(runner, active, options)
    eot = runner.model.generation_config.eos_token_id
    for timestamps, items in work.items():
        if not items:
            continue
        # batch rows must share the prompt length (same model, same mode: always true here)
        enc, encode_s = runner.encode_windows([p.audio for p in items], [p.encoded for p in items])
        seeds = [zlib.crc32(f"{p.cursor.path}:{p.start}".encode("utf-8", "surrogateescape")) for p in items]
        verdicts, calls = decide(runner, enc, [p.cursor.prompt for p in items], timestamps, options, seeds)
        for rows, result in calls:
            for j, r in enumerate(rows):
                _account(items[r].cursor, result, j, 1.0 / len(rows))
            for cur in {id(items[r].cursor): items[r].cursor for r in rows}.values():
                cur.hist.update(result.stats.accepted_hist)
        for piece, verdict in zip(items, verdicts):
            cur, start, audio = piece.cursor, piece.start, piece.audio
            cur.seconds += encode_s / len(items)
            cur.retried += verdict.retried > 0
            cur.skipped += verdict.skipped
            cur.dropped += verdict.dropped
            tokens = [t for t in verdict.tokens if t != eot]
            offset = start / SAMPLE_RATE
            length = len(audio) / SAMPLE_RATE
            if verdict.skipped or verdict.dropped:
                segs, advance = [], length  # nothing said (or nothing worth keeping) in this window
            elif timestamps:
                segs, advance = segments_from_tokens(tokens, runner.timestamp_begin, offset, length,
                                                     runner.tokenizer.decode)
            else:
                text = runner.text_of(tokens)
                segs, advance = ([Segment(round(offset, 2), round(offset + length, 2), text)] if text else []), length
            voiced = voiced_frames(audio)
            segs = split_at_pauses(tighten_segments(segs, voiced, offset), voiced, offset)
            cur.segments += _describe(clamp_segments(segs, offset + length), verdict, options.no_speech_threshold)
            if not _in_chunks(cur, options):
                cur.seek += max(1, int(round(advance * SAMPLE_RATE)))
            else:
                _keep_leftover(cur, start, audio, advance, voiced)
    for cur in active:
        cur.done = not cur.leftovers and cur.reader.ended and cur.seek >= cur.reader.known_length
    return sum(map(len, work.values()))


def clamp_segments(segments: list[Segment], audio_end: float) -> list[Segment]:
    """Segments inside the audio: ends past ``audio_end`` (seconds) cut back to it, a segment starting at or
    after it dropped, and none of zero or negative length (its end moved one timestamp step on, within
    the audio)."""
    out = []
    for seg in segments:
        if seg.start >= audio_end:
            continue
        end = min(seg.end, audio_end)
        if end <= seg.start:
            end = min(audio_end, seg.start + TIME_PRECISION)
        out.append(replace(seg, end=round(end, 2)))
    return out


def _describe(segments: list[Segment], verdict: WindowVerdict, no_speech_threshold: float | None) -> list[Segment]:
    """The window's safeguard figures on each of its segments."""
    p = verdict.no_speech_prob
    flag = p is not None and no_speech_threshold is not None and p > no_speech_threshold
    return [replace(seg, avg_logprob=round(verdict.avg_logprob, 4), no_speech_prob=None if p is None else round(p, 4),
                    compression_ratio=round(verdict.compression_ratio, 3), temperature=verdict.temperature, no_speech=flag)
            for seg in segments]


def _keep_leftover(cur: _Cursor, start: int, audio: np.ndarray, advance: float, voiced: np.ndarray) -> None:
    """Chunked mode: Whisper stopped at a complete segment before the chunk's end (its sequential
    algorithm would seek there). If 0.2 s or more of voice (``voiced``: the chunk's ``voiced_frames``)
    remains after that point, decode the rest as a chunk of its own."""
    cut = int(round(advance * SAMPLE_RATE))
    if 0 < cut and len(audio) - cut >= SAMPLE_RATE and voiced[cut // (SAMPLE_RATE // 100):].sum() >= 20:
        cur.leftovers.append((start + cut, audio[cut:]))


def _account(cur: _Cursor, result, row: int, share: float) -> None:
    stats: DecodeStats = result.stats
    cur.seconds += stats.total_s * share
    cur.decode_seconds += (stats.total_s - stats.encode_s) * share
    cur.tokens += len(result.tokens[row])
    cur.main_calls += stats.row_calls * share
    cur.drafted += stats.drafted * share
    cur.accepted += stats.accepted * share
    if result.identical is not None:
        cur.identical = cur.identical and result.identical[row]
        cur.plain_seconds += result.plain_stats.total_s * share


def _audio_done(cur: _Cursor) -> float:
    """Seconds of the file behind its cursor (chunked mode: less the leftovers still to decode)."""
    pending = sum(len(audio) for _, audio in cur.leftovers)
    return max(0, min(cur.seek, cur.reader.known_length) - pending) / SAMPLE_RATE


def transcribe(paths: Iterable[str | Path], pair: Pair, options: TranscribeOptions = TranscribeOptions(),
               runner: WhisperRunner | None = None,
               progress: Callable[[Progress], None] | None = None) -> Iterator[Transcript]:
    """Transcribe files, ``options.batch_size`` at a time; yields one Transcript per file as it finishes
    (a file that cannot be decoded yields one with ``error`` set, and the run goes on). ``progress`` is
    called after each decoding step (a caller may stop the run there by raising). Raises LanguageError
    before any decoding when the pair's model cannot take ``options.language`` or ``options.task``."""
    runner = runner or WhisperRunner(pair, options.dtype)
    runner.check_language(options)
    require_vad(options.vad_filter)
    queue = list(find_audio(paths))
    active: list[_Cursor] = []
    begun, windows, files_done, finished_audio = time.perf_counter(), 0, 0, 0.0
    while queue or active:
        while queue and len(active) < max(1, options.batch_size):
            path = queue.pop(0)
            t0 = time.perf_counter()
            try:
                active.append(_open(path, options))
            except AudioDecodeError as exc:
                yield Transcript(str(path), "", 0.0, time.perf_counter() - t0, error=exc.reason)
            except OSError as exc:  # unreadable in a way the checks did not foresee: this file fails, the run goes on
                yield Transcript(str(path), "", 0.0, time.perf_counter() - t0, error=f"cannot be read ({exc.strerror or exc})")
        if not active:
            continue
        windows += _step(runner, active, options)
        for cur in [c for c in active if c.done]:
            files_done += 1
            finished_audio += cur.reader.known_length / SAMPLE_RATE
        if progress is not None:
            progress(Progress(windows, files_done, finished_audio + sum(_audio_done(c) for c in active if not c.done),
                              finished_audio + sum(c.reader.known_length for c in active if not c.done) / SAMPLE_RATE,
                              time.perf_counter() - begun))
        for cur in [c for c in active if c.done]:
            active.remove(cur)
            yield _finish(cur, options.compare and options.use_assistant)
