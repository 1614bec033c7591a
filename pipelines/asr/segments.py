"""Timed segments: from Whisper's timestamp tokens, tightened and split at pauses, clamped to the audio."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .options import TIME_PRECISION, Segment
from .safeguards import WindowVerdict


def segments_from_tokens(tokens: list[int], timestamp_begin: int, offset: float, window_seconds: float,
                         decode) -> tuple[list[Segment], float]:
    """Whisper's timestamp tokens -> segments, and how far to advance (seconds).

    Consecutive timestamp pairs close one segment and open the next. If the window ends with a complete
    segment (two timestamps in a row), the next window starts at the last timestamp; if it ends with a
    single timestamp (nothing more was said), the whole window is consumed."""
    pieces, advance = timed_pieces(tokens, timestamp_begin, offset, window_seconds, decode)
    return [seg for seg, _ in pieces if seg is not None], advance


def timed_pieces(tokens: list[int], timestamp_begin: int, offset: float, window_seconds: float,
                 decode) -> tuple[list[tuple[Segment | None, list[int]]], float]:
    """``segments_from_tokens`` keeping every piece between timestamps with its text tokens: (its Segment, or
    None when its text is empty, and the tokens), as word timestamps need them (words.py)."""
    is_ts = [t >= timestamp_begin for t in tokens]
    single_ending = len(tokens) >= 2 and is_ts[-2:] == [False, True]
    cuts = [i for i in range(1, len(tokens)) if is_ts[i] and is_ts[i - 1]]
    segments: list[tuple[Segment | None, list[int]]] = []
    if cuts:
        bounds = cuts + ([len(tokens)] if single_ending else [])
        last = 0
        for cut in bounds:
            piece = tokens[last:cut]
            if piece and piece[0] >= timestamp_begin:
                start = (piece[0] - timestamp_begin) * TIME_PRECISION
                end_tok = piece[-1] if piece[-1] >= timestamp_begin else piece[0]
                end = (end_tok - timestamp_begin) * TIME_PRECISION
                text_tokens = [t for t in piece if t < timestamp_begin]
                text = decode(text_tokens).strip()
                segments.append((Segment(round(offset + start, 2), round(offset + max(end, start), 2), text)
                                 if text else None, text_tokens))
            last = cut
        if single_ending:
            advance = window_seconds
        else:
            advance = (tokens[cuts[-1] - 1] - timestamp_begin) * TIME_PRECISION
            advance = advance if advance > 0 else window_seconds
    else:
        stamps = [t for t in tokens if t >= timestamp_begin]
        end = (stamps[-1] - timestamp_begin) * TIME_PRECISION if stamps and stamps[-1] > timestamp_begin else window_seconds
        text_tokens = [t for t in tokens if t < timestamp_begin]
        text = decode(text_tokens).strip()
        segments.append((Segment(round(offset, 2), round(offset + min(end, window_seconds), 2), text)
                         if text else None, text_tokens))
        advance = window_seconds
    return segments, advance


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


def describe_segments(segments: list[Segment], verdict: WindowVerdict, no_speech_threshold: float | None) -> list[Segment]:
    """The window's safeguard figures on each of its segments."""
    p = verdict.no_speech_prob
    flag = p is not None and no_speech_threshold is not None and p > no_speech_threshold
    return [replace(seg, avg_logprob=round(verdict.avg_logprob, 4), no_speech_prob=None if p is None else round(p, 4),
                    compression_ratio=round(verdict.compression_ratio, 3), temperature=verdict.temperature, no_speech=flag)
            for seg in segments]
