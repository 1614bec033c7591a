"""Speech recognition: audio files in, transcripts and segments out (preprocess -> decode -> postprocess).

Modules: ``options`` (TranscribeOptions, Segment, Transcript, Progress), ``windows`` (streamed 30 s windows,
the energy detector, cuts at pauses), ``features`` (whisper's log-mel of a window), ``segments`` (timestamp
tokens -> timed segments), ``safeguards`` (Whisper's no-speech, log-probability and compression checks,
temperature fallback), ``vad`` (the optional voice-activity filter), ``runner`` (WhisperRunner: the loaded
pair), ``batching`` (the loop over files and ``transcribe``); the batch job of ``tandem transcribe``:
``inputs`` (files, folders, globs -> inputs and their output names), ``outputs`` (transcript formats,
resumable per-file records, the --out lock), ``batch`` (plan, resume, write each result, failures, summary).

preprocess   stream each file as 16 kHz mono, one 30 s window at a time (memory stays bounded; a first pass
             finds the file's loudest log-mel frame, whisper's floor)
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
tokens), so its tokens can be compared with it one for one (fed the same features: ``WhisperRunner.feats``).
A window's features are openai/whisper's (``features``: the slice of the file's log-mel, one floor for the
file, zeros after the audio). Silent windows are skipped (no hallucinated text).
"""

from .batching import transcribe
from .inputs import find_audio
from .options import (
    CHUNK_MAX_SECONDS,
    CHUNK_MIN_SECONDS,
    LONG_FORMS,
    SILENCE_RMS,
    TIME_PRECISION,
    WINDOW,
    WINDOW_SECONDS,
    LanguageError,
    Progress,
    Segment,
    TranscribeOptions,
    Transcript,
)
from .runner import WhisperRunner
from .segments import clamp_segments, segments_from_tokens, split_at_pauses, tighten_segments
from .windows import WindowReader, frame_rms, quiet_cut, voiced_frames

__all__ = [
    "CHUNK_MAX_SECONDS", "CHUNK_MIN_SECONDS", "LONG_FORMS", "SILENCE_RMS", "TIME_PRECISION", "WINDOW", "WINDOW_SECONDS",
    "LanguageError", "Progress", "Segment", "TranscribeOptions", "Transcript", "WhisperRunner", "WindowReader",
    "clamp_segments", "find_audio", "frame_rms", "quiet_cut", "segments_from_tokens", "split_at_pauses",
    "tighten_segments", "transcribe", "voiced_frames",
]
