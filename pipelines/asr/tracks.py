"""Which audio track of a file to read when none is asked for: its first with speech, told from a few
seconds sampled from each track (``audio_av.sample_tracks``) by Silero VAD where the ``vad`` extra is
installed, else by the energy detector."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE
from ..audio_av import sample_tracks
from .vad import VadUnavailable, energy_regions, silero_regions

SPEECH_SECONDS = 0.5  # a track with at least this much speech in its samples (``sample_tracks``) has speech


def has_speech(audio: np.ndarray) -> bool:
    """Whether ``audio`` (16 kHz mono) holds ``SPEECH_SECONDS`` of speech: Silero VAD's regions where it is
    installed (the ``vad`` extra; a tone, hum or noise is not speech to it), else the energy detector's
    (``vad.energy_regions``: anything above silence)."""
    try:
        regions = silero_regions(audio)
    except VadUnavailable:
        regions = energy_regions(audio)
    return sum(end - start for start, end in regions) >= SPEECH_SECONDS * SAMPLE_RATE


def first_speech_track(path: Path) -> tuple[int, bool]:
    """The audio track to read when none is asked for: (index, chosen). A file of several audio tracks gives
    its first track with speech in a few seconds sampled from each (``audio_av.sample_tracks``, ``has_speech``),
    chosen=True; a file of one track, or of none with speech, gives track 0, chosen=False."""
    tracks = sample_tracks(path)
    if len(tracks) > 1:
        for index, audio in enumerate(tracks):
            if has_speech(audio):
                return index, True
    return 0, False
