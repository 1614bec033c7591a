"""What a transcription is asked to do and what it gives back: options, segments, transcripts, progress."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..audio import SAMPLE_RATE
from ..engine import BeamOptions, PolicyOptions
from ..errors import TandemError
from .safeguards import TEMPERATURES, check_options

WINDOW_SECONDS = 30.0  # Whisper's input window
WINDOW = int(WINDOW_SECONDS * SAMPLE_RATE)
TIME_PRECISION = 0.02  # seconds per timestamp token
SILENCE_RMS = 1e-4  # a window quieter than this (root mean square) is silence: nothing to decode
CHUNK_MIN_SECONDS = 15.0  # chunked long-form: a chunk cut at a pause is at least this long
CHUNK_MAX_SECONDS = 26.0  # and at most this long (speech in Whisper's last ~3 s is often left for the next window)
LONG_FORMS = ("sequential", "chunked")


class LanguageError(TandemError, ValueError):
    """The pair's model cannot take the asked language or task (e.g. German on an English-only model)."""


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = "en"  # a language code ("en", "de", ...), or None to detect per file
    task: str = "transcribe"  # "transcribe" or "translate" (into English)
    dtype: str | None = None  # compute dtype; None: devices.resolve_dtype's (the pair's on a CPU)
    device: str = "cpu"  # where the models run: "cpu", "cuda:0" (devices.resolve_device)
    max_new_tokens: int = 440  # per 30 s window (Whisper allows 448 positions including the prompt)
    use_assistant: bool = True  # False: plain decoding with the same main model
    compare: bool = False  # also decode plainly, to time it and check the outputs are identical
    batch_size: int = 4  # windows of different files decoded together
    timestamps: bool = False  # timestamp tokens even for files of one window (always on for longer files)
    policy: PolicyOptions = PolicyOptions()  # how many tokens the assistant drafts each round
    long_form: str = "sequential"  # files over 30 s: "sequential" (Whisper's seek) or "chunked" (cut at pauses, batched)
    # Whisper's safeguards (see safeguards.py; None turns a check off)
    temperature: tuple[float, ...] = TEMPERATURES  # the first decodes greedily, each fallback samples at the next
    compression_ratio_threshold: float | None = 2.4  # text more repetitive than this: fall back
    logprob_threshold: float | None = -1.0  # average log-probability below this: fall back
    no_speech_threshold: float | None = 0.6  # p(no speech) above this (and a low avg_logprob): silence, skipped
    vad_filter: bool = False  # Silero VAD first: audio outside speech set to zero, not decoded (vad.py)
    # Prompts (prompts.py), whisper's and faster-whisper's names: text read before a window, never output
    initial_prompt: str | None = None  # before the first window (and after it, with condition_on_previous_text)
    hotwords: str | None = None  # before every window (faster-whisper's: names and terms spelled as given)
    condition_on_previous_text: bool = False  # each window also reads the file's text so far (sequential only)
    prompt_reset_on_temperature: float = 0.5  # a window kept above this temperature starts the history anew
    prefix: str | None = None  # the file's first window's transcript starts with this text (faster-whisper's, part
    #                            of the output; both models read it, nobody reads its logits)
    audio_track: int | None = None  # which audio stream of a file with several (0-based among its audio
    #                                 streams); None: the first with speech (asr.tracks.first_speech_track)
    # Word-level timestamps (words.py, whisper's method and names): each segment's words, timestamps forced on
    word_timestamps: bool = False
    prepend_punctuations: str = "\"'“¿([{-"  # marks joined to the word after them
    append_punctuations: str = "\"'.。,，!！?？:：”)]}、"  # marks joined to the word before them
    # Beam search and best-of (whisper's names and semantics, engine/beam.py), exact with the assistant
    beam_size: int | None = None  # at temperature 0: beams per window (None: greedy, measured the faster)
    patience: float | None = None  # with beam_size: a window ends once round(beam_size * patience) texts finished
    length_penalty: float | None = None  # ranking of the candidates: None sum / length, alpha in [0, 1]:
    #                                      sum / ((5 + length) / 6) ** alpha (Google NMT's)
    best_of: int | None = None  # at each fallback temperature > 0: samples per window, the best by that ranking

    def __post_init__(self) -> None:
        check_options(self)
        if self.long_form not in LONG_FORMS:
            raise ValueError(f"long_form must be one of {', '.join(LONG_FORMS)}, not {self.long_form!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {self.batch_size}")
        if self.audio_track is not None and self.audio_track < 0:
            raise ValueError(f"audio_track must be 0 or more, not {self.audio_track}")
        check_search(self)
        if self.condition_on_previous_text and self.long_form == "chunked":
            raise ValueError("condition_on_previous_text needs long_form 'sequential': chunked windows are "
                             "decoded side by side, before the text before them is known")


# beams or best_of samples a window at most: each is a decoder row of its own, for every window of a batch, with its
# own cache (Whisper base in float32: 2 x 6 layers x 1500 x 512 x 4 bytes = 37 MB of cross-attention keys and
# values a row); whisper's default is 5
MAX_CANDIDATES = 32


def check_search(options: TranscribeOptions) -> None:
    """Raise ValueError with a sentence for beam search or best-of options out of range or without their use
    (whisper decodes with beams at temperature 0 only, and samples best_of texts at the temperatures above)."""
    for name, n in (("beam_size", options.beam_size), ("best_of", options.best_of)):
        if n is not None and n > MAX_CANDIDATES:
            raise ValueError(f"{name} is {n}, at most {MAX_CANDIDATES}: each is a decoder row with its own cache, "
                             f"for every window of a batch (whisper's default is 5)")
    if options.beam_size is not None:
        BeamOptions(options.beam_size, options.patience, options.length_penalty)  # (its ranges)
        if 0.0 not in options.temperature:
            raise ValueError("beam_size searches at temperature 0, which the temperature schedule lacks")
    elif options.patience is not None:
        raise ValueError("patience needs beam_size (it counts finished beams)")
    if options.best_of is not None:
        if options.best_of < 1:
            raise ValueError(f"best_of must be at least 1, not {options.best_of}")
        if not any(t > 0 for t in options.temperature):
            raise ValueError("best_of samples at temperatures above 0, which the temperature schedule lacks")
    if options.length_penalty is not None:
        if options.beam_size is None and options.best_of is None:
            raise ValueError("length_penalty ranks several candidates: it needs beam_size or best_of")
        BeamOptions(1, length_penalty=options.length_penalty)  # whisper's range, 0 to 1


@dataclass(frozen=True)
class Word:
    """A word of a segment (``word_timestamps``), faster-whisper's names; ``word`` keeps its leading space."""

    start: float  # seconds from the start of the file
    end: float
    word: str
    probability: float  # mean probability of its tokens


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
    words: tuple[Word, ...] = ()  # with word_timestamps: its words, in order
    language: str | None = None  # language=None (auto): the language detected on the segment's window
    language_probability: float | None = None  # and its probability (softmax over the language tokens)


@dataclass(frozen=True)
class DroppedWindow:
    """A window the safeguards dropped (still repetitive or unlikely at the last temperature): nothing written."""

    start: float  # seconds from the start of the file (counted as the segments are)
    end: float
    reason: str  # "repetitive: compression ratio 3.10 > 2.4 at temperature 1.0", "unlikely: ..."


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
    cut: int = 0  # windows whose text stopped at the token limit (max_new_tokens, Whisper's 448 positions)
    finish_reason: str = "stop"  # "length" when a window was cut so (OpenAI's and transformers' name), else "stop"
    # from the audio's decoding (pipelines.audio.DecodeReport)
    start_offset: float = 0.0  # seconds from the container's start to the audio's (already added to the segments)
    audio_track: int | None = None  # the audio track read, when the file has several (0-based)
    audio_tracks: int = 1  # audio tracks in the file
    audio_track_chosen: bool = False  # audio_track was chosen as the file's first with speech (none was asked for)
    damaged: bool = False  # part of the file could not be decoded as its header says (decode_warnings say how)
    truncated: bool = False  # the file ends clearly before the duration it declares
    decode_warnings: tuple[str, ...] = ()  # one line each
    seconds_recovered: float | None = None  # when damaged: seconds of the file's own audio decoded
    dropped_windows: tuple[DroppedWindow, ...] = ()  # the ``dropped`` windows, each with its times and reason

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def audio_note(self) -> str:
        """How the audio was read, in a few words ("" when there is nothing to say): "truncated, 4.9 s
        recovered", "damaged (a damaged block at 4.79 s was skipped ...), 8.5 s recovered", "audio track 1 of
        2 (counted from 0; the first with speech)", "audio starts at 4.98 s" (the times already count from the container's start)."""
        parts = []
        if self.truncated:
            parts.append(f"truncated, {self.seconds_recovered or 0:.1f} s recovered")
        elif self.damaged:
            first = self.decode_warnings[0] if self.decode_warnings else "damaged"
            more = f" and {len(self.decode_warnings) - 1} more" if len(self.decode_warnings) > 1 else ""
            parts.append(f"damaged ({first}{more}), {self.seconds_recovered or 0:.1f} s recovered")
        if self.audio_track is not None:
            parts.append(f"audio track {self.audio_track} of {self.audio_tracks} (counted from 0"
                         + ("; the first with speech)" if self.audio_track_chosen else ")"))
        if self.start_offset:
            parts.append(f"audio starts at {self.start_offset:.2f} s")
        return "; ".join(parts)


@dataclass(frozen=True)
class Progress:
    """Where a ``transcribe`` call stands, reported after each decoding step (``transcribe(progress=...)``)."""

    windows: int  # 30 s windows (or chunks) decoded so far, all files
    files_done: int  # files decoded to the end
    audio_done: float  # seconds of audio decoded so far: finished files, and the active files up to their cursor
    audio_known: float  # seconds of audio read so far (a file counts in full once read to its end)
    elapsed: float  # seconds since the call started
    audio_expected: float = 0.0  # seconds the files opened so far hold: what each declares (its header or
    #                              stream), what was read where that is more or the file is read to its end

    @property
    def audio_total(self) -> float:
        """Seconds of audio the run is expected to decode (the files opened so far)."""
        return max(self.audio_expected, self.audio_known, self.audio_done)

    @property
    def windows_expected(self) -> int:
        """Windows (or chunks) the run should take in all, estimated from the pace so far: with d seconds
        decoded in w windows and T expected, w + ceil((T - d) / (d / w)); before any, ceil(T / 30)."""
        left = max(0.0, self.audio_total - self.audio_done)
        if self.windows == 0 or self.audio_done <= 0:
            return max(1, math.ceil(left / WINDOW_SECONDS - 1e-9))
        return self.windows + math.ceil(left * self.windows / self.audio_done - 1e-9)

    @property
    def seconds_left(self) -> float | None:
        """Wall seconds the run should still take at the pace so far: elapsed * (T - d) / d; None before
        any audio is decoded."""
        if self.audio_done <= 0:
            return None
        return self.elapsed * max(0.0, self.audio_total - self.audio_done) / self.audio_done
