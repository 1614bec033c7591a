"""PyAV (ffmpeg) decoding for ``pipelines.audio``: any container, any of its audio tracks, damage tolerated.

A packet ffmpeg cannot decode (``InvalidDataError``) is counted and skipped; a hole in the stream's timestamps
(blocks lost to damage) is filled with silence, so the times after it stay where they were. Where the track
starts in its container (a video whose audio begins 5 s in) and what duration it declares go into the
``DecodeNotes``; nothing is printed. AAC priming that the container does not mark (an MP4 without an edit
list, raw ADTS) is dropped, so times match the same audio as WAV. ``sample_tracks`` decodes a few seconds of
each track (which one has speech: ``asr.tracks``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .audio_report import SAMPLE_RATE, AudioDecodeError, DecodeNotes

GAP_SECONDS = 0.02  # a jump in the stream's timestamps beyond this is a hole (lost blocks), filled with silence


def _start_offset(container, stream) -> float:
    """Seconds from the container's start (its earliest stream's) to the track's first sample; never negative,
    and 0 for a file of one stream (a player counts its time from that stream's start)."""
    if stream.start_time is None or stream.time_base is None or len(container.streams) == 1:
        return 0.0
    starts = [float(s.start_time * s.time_base) for s in container.streams
              if s.start_time is not None and s.time_base is not None]
    origin = container.start_time / 1e6 if container.start_time is not None else min(starts)
    return max(0.0, float(stream.start_time * stream.time_base) - min([origin, *starts]))


def _declared(container, stream) -> float | None:
    """The track's declared duration (its own, or the container's when the track is its only stream)."""
    if stream.duration and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration and len(container.streams) == 1:
        return container.duration / 1e6
    return None


def sample_tracks(path: Path, spans: int = 3, seconds: float = 8.0) -> list[np.ndarray]:
    """Each audio track of ``path``, in order, sampled: 16 kHz mono float32 from ``spans`` stretches of
    ``seconds`` each, at 0, 1/spans, 2/spans, ... of the duration it declares (one stretch of ``spans *
    seconds`` from its start when it declares none or is shorter than twice that), joined. Cheap: a few
    seconds decoded per track. A track that stops decoding gives what it gave; [] for a file of fewer than two
    audio tracks (nothing to choose from: nothing is decoded) and when PyAV cannot open the file."""
    import av

    try:
        with open(path, "rb") as fh, av.open(fh) as container:
            count = len(container.streams.audio)
        found: list[np.ndarray] = []
        if count < 2:
            return found
        for index in range(count):
            with open(path, "rb") as fh, av.open(fh) as container:
                found.append(_sample_track(av, container, container.streams.audio[index], spans, seconds))
        return found
    except (av.error.FFmpegError, UnicodeDecodeError, OSError):
        return []


def _sample_track(av, container, stream, spans: int, seconds: float) -> np.ndarray:
    declared = _declared(container, stream) or 0.0
    if declared < 2 * spans * seconds or stream.time_base is None:
        starts, seconds = [0.0], spans * seconds
    else:
        starts = [k * declared / spans for k in range(spans)]
    pieces = []
    for start in starts:
        if start:
            container.seek(int(start / stream.time_base) + (stream.start_time or 0), stream=stream)
        resampler, got = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE), 0
        try:
            for packet in container.demux(stream):
                for frame in packet.decode():
                    for out in resampler.resample(frame):
                        pieces.append(out.to_ndarray().reshape(-1))
                        got += pieces[-1].size
                if got >= seconds * SAMPLE_RATE:
                    break
        except av.error.FFmpegError:
            continue  # damage here: the other stretches may still tell
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def stream_av(path: Path, block_seconds: float, notes: DecodeNotes) -> Iterator[np.ndarray]:
    """Audio track ``notes.track`` of ``path`` as 16 kHz mono float32 blocks of about ``block_seconds``."""
    import av

    fh = open(path, "rb")  # a file object: names that are not UTF-8 reach ffmpeg intact
    try:
        container = av.open(fh)
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        fh.close()
        raise AudioDecodeError(path, f"not an audio file or unsupported format ({exc.__class__.__name__})") from None
    with fh, container:
        tracks = container.streams.audio
        if not tracks:
            raise AudioDecodeError(path, "the file has no audio stream")
        if notes.track >= len(tracks):
            raise AudioDecodeError(path, f"audio track {notes.track} asked for, but the file has "
                                         f"{_plural(len(tracks), 'audio track')} (0-based: 0 to {len(tracks) - 1})")
        stream = tracks[notes.track]
        notes.tracks, notes.start_offset = len(tracks), _start_offset(container, stream)
        notes.declared_seconds = _declared(container, stream)
        pending: list[np.ndarray] = []
        pending_len, block = 0, int(block_seconds * SAMPLE_RATE)
        for samples in _samples(av, container, stream, notes):
            notes.samples += len(samples)
            pending.append(samples)
            pending_len += len(samples)
            if pending_len >= block:
                yield np.concatenate(pending)
                pending, pending_len = [], 0
        if pending_len:
            yield np.concatenate(pending)
        notes.ended = True
        if notes.samples == 0:
            if notes.damaged_blocks:
                raise AudioDecodeError(path, f"corrupt audio data: none of its {_plural(notes.damaged_blocks, 'block')} "
                                             "could be decoded")
            raise AudioDecodeError(path, "zero-length audio (no samples decoded)")


AAC_PRIMING = 1024  # samples an AAC-LC encoder puts before the audio (ffmpeg's and fdk-aac's encoder delay)
UNSIGNALLED = {"mov", "aac"}  # ffmpeg's demuxers whose AAC priming is dropped only when the file marks it
#                               (MP4/MOV/M4A by an edit list; raw ADTS never); Matroska's CodecDelay always is


def _unsignalled_priming(stream, packet, container, notes: DecodeNotes) -> int:
    """16 kHz samples of AAC priming to drop before the track's audio, where its container does not say so.

    An MP4 (or MOV, M4A) with an edit list marks its first packet as priming (``is_discard``, negative time) and ffmpeg drops
    it; an MP4 without one, and a raw ADTS ``.aac``, do not, so every time would be 1024 / rate late (21 ms at
    48 kHz, 64 ms at 16 kHz) against the same audio as WAV. Those first 1024 samples are dropped, and the track's
    audio starts that much later in its container (``notes.start_offset``, for a file of several streams)."""
    formats = set(container.format.name.split(","))
    if stream.codec_context.name != "aac" or packet.is_discard or not stream.sample_rate or not formats & UNSIGNALLED:
        return 0
    if len(container.streams) > 1:  # a file of one stream starts at 0 (``_start_offset``)
        notes.start_offset += AAC_PRIMING / stream.sample_rate
    return round(AAC_PRIMING * SAMPLE_RATE / stream.sample_rate)


def _samples(av, container, stream, notes: DecodeNotes) -> Iterator[np.ndarray]:
    """The track's 16 kHz mono samples, packet by packet: a packet that does not decode is skipped and
    counted, a hole in the timestamps after it filled with silence; unsignalled AAC priming dropped."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    end = None  # the stream's time just past the last decoded frame (seconds)
    errors_since_frame, skip, first = 0, 0, True
    demux = container.demux(stream)
    while True:
        try:
            packet = next(demux)
        except StopIteration:
            break
        except av.error.FFmpegError as exc:
            notes.damage(f"the file cannot be read past {notes.samples / SAMPLE_RATE:.2f} s ({exc.strerror or exc})")
            break
        if first:
            skip, first = _unsignalled_priming(stream, packet, container, notes), False
        try:
            frames = packet.decode()
        except av.error.FFmpegError as exc:
            errors_since_frame += 1
            notes.damage(f"a damaged block at {notes.samples / SAMPLE_RATE:.2f} s was skipped ({exc.strerror or exc})")
            continue
        for frame in frames:
            time = frame.time
            if time is not None and end is not None and time - end > GAP_SECONDS:
                gap = time - end
                if not errors_since_frame:  # a hole no decode error explains: blocks the demuxer skipped
                    notes.damage(f"{gap:.2f} s of damaged audio at {notes.samples / SAMPLE_RATE:.2f} s "
                                 "filled with silence")
                notes.filled_seconds += gap
                yield np.zeros(int(round(gap * SAMPLE_RATE)), dtype=np.float32)
            start = time if time is not None else (end or 0.0)
            end = start + frame.samples / frame.sample_rate
            errors_since_frame = 0
            for out in resampler.resample(frame):
                samples = out.to_ndarray().reshape(-1)
                yield samples[skip:]
                skip = max(0, skip - len(samples))
    for out in resampler.resample(None):
        yield out.to_ndarray().reshape(-1)[skip:]
