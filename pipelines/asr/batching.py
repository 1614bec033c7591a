"""The transcription loop: files as cursors, windows (or chunks) of several files decoded in one batch
through the engine, safeguards applied, segments appended; ``transcribe`` is the public entry point."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE
from ..models.registry import Pair
from .cursors import Cursor, account, ceiling_of, finish, open_files, progress_of
from .features import HALF, Span
from .inputs import find_audio
from .options import DroppedWindow, Progress, Segment, TranscribeOptions, Transcript
from .prompts import PromptHistory, prefix_tokens, prompt_tokens, window_prompt
from .runner import WhisperRunner, check_prompts
from .safeguards import MIN_AUDIO_SECONDS, decide
from .segments import clamp_segments, describe_segments, split_at_pauses, tighten_segments, timed_pieces
from .vad import filter_speech, require_vad
from .windows import is_silent_window, quiet_cut, voiced_frames
from .words import add_word_timestamps, seek_after_words


def _in_chunks(cur: Cursor, options: TranscribeOptions) -> bool:
    """Whether this file is cut into independent chunks (chunked mode, longer than one window)."""
    return options.long_form == "chunked" and not cur.single


def _next_chunk(cur: Cursor, options: TranscribeOptions) -> Span | None:
    """The cursor's next piece of audio to decode (with the file's samples around it and its loudest frame, or
    None where the piece is all of a file ``open_cursor`` did not measure), or None when the file is done. Sequential
    mode gives the 30 s window at the seek (the seek moves after decoding, by the timestamps); chunked mode cuts
    the window at a pause (``quiet_cut``) and moves the seek past it now."""
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
    whole = cur.measure is not None and start == 0 and len(audio) == cur.reader.known_length  # floored by itself
    return Span(audio, start, *cur.reader.around(start, len(audio)), ceiling=None if whole else ceiling_of(cur),
                silence_after=_in_chunks(cur, options))  # a chunk reads as followed by silence (features.log_mel)


@dataclass(frozen=True)
class _Piece:
    """Audio of one file to decode in this step."""

    cursor: Cursor
    span: Span  # its samples, where it starts in the file (samples), the samples around it, the file's loudest frame
    prompt: list[int] | None  # the decoder's prompt: text prompt (if any), then ``sot``; None until detected
    sot: list[int] | None  # <|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>]; None: language to detect
    encoded: object = None  # its encoder output when language detection already computed it
    forced: tuple[int, ...] = ()  # the prompt's last tokens, the transcript's start: [<|0.00|>] prefix (prompts.py)
    language: str | None = None  # auto: the language detected on this piece, and its probability
    language_probability: float | None = None

    @property
    def start(self) -> int:
        """The sample of the file where it starts."""
        return self.span.start

    @property
    def audio(self) -> np.ndarray:
        return self.span.audio


def _auto(runner: WhisperRunner, options: TranscribeOptions) -> bool:
    """Whether each window's language is detected (``language=None`` on a multilingual model)."""
    return options.language is None and runner.multilingual


def _with_prompt(runner: WhisperRunner, piece: _Piece, sot: list[int], options: TranscribeOptions) -> _Piece:
    """``piece`` with its start-of-transcript tokens and its decoder prompt: the text prompt (hotwords, the
    file's text so far) before them (``prompts.window_prompt``), and at the file's start the ``prefix`` after them."""
    prompt = window_prompt(sot, runner.sot_prev, prompt_tokens(runner.tokenizer, options.hotwords),
                           piece.cursor.history.tokens)
    stamp = None if piece.cursor.single else runner.timestamp_begin
    forced = tuple(prefix_tokens(runner.tokenizer, options.prefix, stamp)) if piece.start == 0 else ()
    return replace(piece, sot=sot, prompt=prompt + list(forced), forced=forced)


def _detect_languages(runner: WhisperRunner, work: dict[bool, list[_Piece]], options: TranscribeOptions) -> None:
    """Auto language: every piece without one is encoded (one encoder pass for all of them, which decoding
    then reuses: ``_Piece.encoded``), its language detected from that pass (``WhisperRunner.languages_of``) and
    its prompt built in that language. A file's language is its first decoded window's (whisper's)."""
    todo = [(mode, i) for mode, pieces in work.items() for i, p in enumerate(pieces) if p.sot is None]
    if not todo:
        return
    hidden = runner.encode(runner.feats([work[mode][i].span for mode, i in todo]))
    for (mode, i), h, (language, p) in zip(todo, hidden, runner.languages_of(hidden)):
        piece = work[mode][i]
        piece.cursor.language = piece.cursor.language or language
        sot = runner.prompt(language, options.task, timestamps=not piece.cursor.single)
        work[mode][i] = replace(_with_prompt(runner, piece, sot, options), encoded=h, language=language,
                                language_probability=round(p, 4))


def _gather(runner: WhisperRunner, active: list[Cursor], options: TranscribeOptions) -> dict[bool, list[_Piece]]:
    """The pieces to decode in this step, by timestamp mode: one window per file (sequential), or in
    chunked mode as many chunks of the active files as fill the batch. Silent pieces are skipped. With
    ``language=None`` each piece's language is detected from its own encoder pass (``_detect_languages``)."""
    work: dict[bool, list[_Piece]] = {True: [], False: []}
    for cur in active:
        while not cur.done and sum(map(len, work.values())) < max(1, options.batch_size):
            span = _next_chunk(cur, options)
            if span is None:
                break
            if options.vad_filter:  # the samples outside speech are zero, and the file around them reads so
                span = replace(span, audio=filter_speech(span.audio, True), before=np.zeros_like(span.before),
                               after=np.zeros_like(span.after))
            audio = span.audio
            too_short = cur.reader.ended and cur.reader.known_length < MIN_AUDIO_SECONDS * SAMPLE_RATE
            if is_silent_window(audio) or too_short:
                if not _in_chunks(cur, options):
                    cur.seek += len(audio)
                cur.done = cur.reader.ended and cur.seek >= cur.reader.known_length
                continue
            if not cur.started:
                cur.started = True
                cur.history = PromptHistory(prompt_tokens(runner.tokenizer, options.initial_prompt))
                if not _auto(runner, options):
                    cur.language = options.language or "en"
                    cur.prompt = runner.prompt(cur.language, options.task, timestamps=not cur.single)
            piece = _Piece(cur, span, None, None)
            work[not cur.single].append(piece if cur.prompt is None else _with_prompt(runner, piece, cur.prompt, options))
            if not _in_chunks(cur, options):
                break  # sequential: the next window depends on this one's timestamps
    return work


def window_seed(audio: np.ndarray, start: int) -> int:
    """The seed of a window's sampled fallbacks: crc32 of its float32 samples, then of its start (in samples),
    so that a file gives the same transcript wherever it lives and whatever its name (a seed from the path
    made a copied folder, or a test's temporary one, sample other fallbacks)."""
    return zlib.crc32(str(start).encode(), zlib.crc32(np.ascontiguousarray(audio, dtype=np.float32).tobytes()))


def _step(runner: WhisperRunner, active: list[Cursor], options: TranscribeOptions) -> int:
    """Advance every active cursor: its next window (or chunks) decoded together with the other files',
    under Whisper's safeguards (``safeguards.decide``). Returns how many windows (or chunks) were decoded."""
    work = _gather(runner, active, options)
    _detect_languages(runner, work, options)
    # batch rows share the prompt length: one engine call per timestamp mode, prompt length and forced prefix
    # length (text prompts of different lengths, e.g. each file's previous text, decode in calls of their own)
    groups: dict[tuple[bool, int, int], list[_Piece]] = {}
    for timestamps, pieces in work.items():
        for piece in pieces:
            groups.setdefault((timestamps, len(piece.prompt), len(piece.forced)), []).append(piece)
    for (timestamps, _, _), items in groups.items():
        enc, encode_s = runner.encode_windows([p.span for p in items], [p.encoded for p in items])
        seeds = [window_seed(p.audio, p.start) for p in items]
        verdicts, calls = decide(runner, enc, [p.prompt for p in items], timestamps, options, seeds)
        for rows, result in calls:
            for j, r in enumerate(rows):
                account(items[r].cursor, result, j, 1.0 / len(rows))
            for cur in {id(items[r].cursor): items[r].cursor for r in rows}.values():
                cur.hist.update(result.stats.accepted_hist)
        for row, (piece, verdict) in enumerate(zip(items, verdicts)):
            piece.cursor.seconds += encode_s / len(items)
            record_window(runner, piece, verdict, enc.hidden[row], timestamps, options)
    for cur in active:
        cur.done = cur.at_end()
    return sum(map(len, work.values()))


def record_window(runner: WhisperRunner, piece: _Piece, verdict, hidden, timestamps: bool,
                  options: TranscribeOptions) -> None:
    """What a decoded window adds to its file: the safeguards' counts (``verdict``: a ``WindowVerdict``), the
    prompt history, its segments (word timestamps from ``hidden``, its encoder output (S, D), where asked) and
    the file's next seek (sequential) or the chunk's leftover (chunked)."""
    cur, start, audio = piece.cursor, piece.start, piece.audio
    eot = runner.model.generation_config.eos_token_id
    cur.retried += verdict.retried > 0
    cur.skipped += verdict.skipped
    cur.dropped += verdict.dropped
    if verdict.dropped:
        cur.dropped_windows.append(DroppedWindow(round(start / SAMPLE_RATE, 2),
                                                 round((start + len(audio)) / SAMPLE_RATE, 2), verdict.reason))
    kept = not (verdict.skipped or verdict.dropped)
    tokens = (list(piece.forced) if kept else []) + [t for t in verdict.tokens if t != eot]  # a prefix starts it
    if kept:
        cur.history.add(tokens, verdict.temperature, options.condition_on_previous_text,
                        options.prompt_reset_on_temperature)
    cur.cut += kept and eot not in verdict.tokens and len(verdict.tokens) >= options.max_new_tokens
    offset = start / SAMPLE_RATE
    length = len(audio) / SAMPLE_RATE
    pieces: list = []
    if verdict.skipped or verdict.dropped:
        segs, advance = [], length  # nothing said (or nothing worth keeping) in this window
    elif timestamps:
        pieces, advance = timed_pieces(tokens, runner.timestamp_begin, offset, length, runner.tokenizer.decode)
        segs = [seg for seg, _ in pieces if seg is not None]
    else:
        text = runner.text_of(tokens)
        segs, advance = ([Segment(round(offset, 2), round(offset + length, 2), text)] if text else []), length
    voiced = voiced_frames(audio)
    if options.word_timestamps and segs:  # whisper's: segments take their words' bounds (words.py)
        segs, cur.last_speech = add_word_timestamps(
            runner, hidden, piece.sot, pieces, min(3000, len(audio) // 160), offset,
            piece.language or cur.language,
            cur.last_speech, options.prepend_punctuations, options.append_punctuations)
        advance = seek_after_words(segs, tokens, runner.timestamp_begin, offset, advance)
    else:
        segs = split_at_pauses(tighten_segments(segs, voiced, offset), voiced, offset)
    segs = describe_segments(clamp_segments(segs, offset + length), verdict, options.no_speech_threshold)
    if piece.language is not None:  # auto: each segment says its window's language
        segs = [replace(seg, language=piece.language, language_probability=piece.language_probability)
                for seg in segs]
    cur.segments += segs
    if not _in_chunks(cur, options):
        cur.seek += max(1, int(round(advance * SAMPLE_RATE)))
    else:
        _keep_leftover(cur, piece.span, advance, voiced)


def _keep_leftover(cur: Cursor, chunk: Span, advance: float, voiced: np.ndarray) -> None:
    """Chunked mode: Whisper stopped at a complete segment before the chunk's end (its sequential
    algorithm would seek there). If 0.2 s or more of voice (``voiced``: the chunk's ``voiced_frames``)
    remains after that point, decode the rest as a chunk of its own."""
    cut, audio = int(round(advance * SAMPLE_RATE)), chunk.audio
    if 0 < cut and len(audio) - cut >= SAMPLE_RATE and voiced[cut // (SAMPLE_RATE // 100):].sum() >= 20:
        before = np.concatenate([chunk.before, audio[:cut]])[-HALF:]  # the file's samples before the cut
        cur.leftovers.append(replace(chunk, audio=audio[cut:], start=chunk.start + cut, before=before,
                                     ceiling=ceiling_of(cur)))  # not the whole file: the file's floor


def transcribe(paths: Iterable[str | Path], pair: Pair, options: TranscribeOptions = TranscribeOptions(),
               runner: WhisperRunner | None = None,
               progress: Callable[[Progress], None] | None = None,
               admit: Callable[[int], list[Path]] | None = None,
               watch: Callable[[str, tuple[Segment, ...]], bool] | None = None) -> Iterator[Transcript]:
    """Transcribe files, ``options.batch_size`` at a time; yields one Transcript per file as it finishes
    (a file that cannot be decoded yields one with ``error`` set, and the run goes on). ``progress`` is
    called after each decoding step (a caller may stop the run there by raising). ``admit(room)``, when
    given, is asked before each step for up to ``room`` more files (paths taken as they are), which join the
    files being decoded at that step boundary (a server's scheduler); the run ends when nothing is left and
    ``admit`` gives nothing. ``watch(path, segments)``, when given, is called after each step for every file
    decoded in it, with the segments that step added (in decoding order, times as decoded; none for a silent
    window): a server streams them; returning False drops the file from the run at that step boundary (its
    request was cancelled: it is decoded no further and yields nothing). Raises LanguageError before any
    decoding when the pair's model cannot take ``options.language`` or ``options.task``."""
    require_vad(options.vad_filter)  # before any model loads
    runner = runner or WhisperRunner(pair, options.dtype, options.device)
    runner.check_language(options)
    check_prompts(runner.tokenizer, options)
    queue = list(find_audio(paths))
    active: list[Cursor] = []
    begun, windows, files_done, finished_audio = time.perf_counter(), 0, 0, 0.0
    while True:
        if admit is not None and len(queue) + len(active) < max(1, options.batch_size):
            queue += admit(max(1, options.batch_size) - len(queue) - len(active))
        if not (queue or active):
            break
        yield from open_files(queue, active, options, runner)
        if not active:
            continue
        before = {id(c): len(c.segments) for c in active}
        windows += _step(runner, active, options)
        if watch is not None:
            for cur in [c for c in active if not watch(str(c.path), tuple(c.segments[before[id(c)]:]))]:
                active.remove(cur)
        for cur in [c for c in active if c.done]:
            files_done += 1
            finished_audio += cur.reader.known_length / SAMPLE_RATE
        if progress is not None:
            progress(progress_of(windows, files_done, finished_audio, [c for c in active if not c.done],
                                 time.perf_counter() - begun))
        for cur in [c for c in active if c.done]:
            active.remove(cur)
            yield finish(cur, options.compare and options.use_assistant)
