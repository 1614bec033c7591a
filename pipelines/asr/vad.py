"""Voice-activity filter before decoding (``TranscribeOptions.vad_filter``, ``tandem transcribe --vad-filter``).

With the filter on, each window (or chunk) goes through Silero VAD v6, the model faster-whisper ships, by
faster-whisper's own ``get_speech_timestamps`` with its defaults (threshold 0.5, speech padded by 0.4 s,
pauses under 2 s kept). The samples outside the speech it finds are set to zero before the window is
decoded, so a window without speech is digital silence and is skipped as today (``asr.windows.is_silent_window``): no
text, and the timestamps of the rest stay in the file's own time. Silero comes from faster-whisper (the
``vad`` extra: ``pip install -e '.[vad]'``); without it, ``--vad-filter`` stops with one sentence that says so.

The energy detector (``energy_regions``) is what Tandem decodes without the filter: every window louder
than ``asr.SILENCE_RMS``, with the frames of ``asr.voiced_frames`` as its speech. It is kept here to be
measured against Silero (``python -m pipelines.quality.bench_vad``).
"""

from __future__ import annotations

import numpy as np

from ..audio import SAMPLE_RATE
from ..errors import TandemError

VAD_INSTALL = "pip install -e '.[vad]'"  # where Silero comes from (faster-whisper and onnxruntime)


class VadUnavailable(TandemError, ImportError):
    """The Silero voice-activity filter was asked for but faster-whisper (which ships it) is not installed."""


def silero_regions(audio: np.ndarray) -> list[tuple[int, int]]:
    """Speech in ``audio`` (16 kHz mono float) as (start, end) sample ranges, by Silero VAD v6 through
    faster-whisper's ``get_speech_timestamps`` with its default ``VadOptions``. Raises VadUnavailable
    when faster-whisper (or onnxruntime) is missing."""
    if len(audio) == 0:
        return []
    spans = _silero()(np.ascontiguousarray(audio, dtype=np.float32))
    return [(int(s["start"]), min(int(s["end"]), len(audio))) for s in spans]


def _silero():
    """faster-whisper's ``get_speech_timestamps``; VadUnavailable with the install line when it cannot load."""
    try:
        import onnxruntime  # noqa: F401  (faster-whisper's model needs it: fail here, with the sentence)
        from faster_whisper.vad import get_speech_timestamps
    except ImportError as exc:
        raise VadUnavailable(f"--vad-filter needs faster-whisper's Silero model ({exc.name or exc} is missing): "
                             f"{VAD_INSTALL}") from None
    return get_speech_timestamps


def energy_regions(audio: np.ndarray) -> list[tuple[int, int]]:
    """Speech as the energy detector sees it, as (start, end) sample ranges: none when the audio's RMS is
    below ``asr.SILENCE_RMS`` (the window is not decoded), else the runs of ``asr.voiced_frames`` (10 ms
    frames louder than 5% of the loud frames and than 1e-3 RMS)."""
    from .windows import is_silent_window, voiced_frames  # asr imports this module: import on use

    if len(audio) == 0 or is_silent_window(audio):
        return []
    voiced = np.concatenate([[False], voiced_frames(audio), [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(voiced))
    hop = SAMPLE_RATE // 100
    return [(int(a) * hop, int(b) * hop) for a, b in zip(edges[::2], edges[1::2])]


def mute_outside(audio: np.ndarray, regions: list[tuple[int, int]]) -> np.ndarray:
    """A copy of ``audio`` with every sample outside ``regions`` (sample ranges) set to zero."""
    kept = np.zeros_like(audio)
    for start, end in regions:
        kept[start:end] = audio[start:end]
    return kept


def filter_speech(audio: np.ndarray, vad_filter: bool) -> np.ndarray:
    """The audio to decode: unchanged with the filter off; with it on, zero outside Silero's speech."""
    return mute_outside(audio, silero_regions(audio)) if vad_filter else audio


def require_vad(vad_filter: bool) -> None:
    """Raise VadUnavailable (an ImportError) before any decoding when the filter is on and Silero is missing."""
    if vad_filter:
        _silero()
