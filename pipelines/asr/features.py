"""Whisper's log-mel features as openai/whisper computes them (``whisper/audio.py``, ``whisper/transcribe.py``):
a window's features are the slice of the whole file's log-mel, floored 8 below the file's loudest frame,
padded to 3000 frames with zeros after the normalisation. faster-whisper does the same.

openai/whisper's ``transcribe`` takes ``log_mel_spectrogram(audio, padding=N_SAMPLES)`` of the whole file: a
``torch.stft`` (400-sample Hann window, hop 160, centred: the file reflected at its start, and 30 s of zeros
appended, so zeros after its end), |X|^2, the mel filters, log10 of max(power, 1e-10), then one floor for the
file, L = max(log_spec, max(log_spec) - 8), and (L + 4) / 4. A window at frame ``seek`` is
``pad_or_trim(mel[:, seek:seek + min(3000, content_frames - seek)], 3000)``: the padding frames read 0.

Here a window is a ``Span``: its samples, the file's 200 samples on either side of it (the first and last
frames reach that far) and the file's loudest frame (``loudest_frame``, a pass over the file's blocks, one
block in memory at a time), so a window is computed alone and a long file is never held whole. Frame i of a
window starting at file sample s covers file samples [s + 160 i - 200, s + 160 i + 200): for s a multiple of
160 (whisper's seeks are) the same frame as whisper's frame s / 160 + i.

The mel filters are transformers' (``WhisperFeatureExtractor.mel_filters``, slaney, computed in float64);
openai/whisper ships librosa's, in float32: they differ by at most 1.9e-9 (of values up to 0.026; 99.3% of
the entries are equal), and a window's features by at most 1.2e-7 from whisper's (one float32 step at 1: long-01,
long-02 and three speech-real clips, every window; ``tests/test_features.py`` checks 1e-5 against openai-whisper)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

N_FFT = 400  # samples of a frame's window (25 ms)
HOP = 160  # samples between frames (10 ms)
HALF = N_FFT // 2  # a frame reaches this far either side of its centre
FRAMES = 3000  # frames of a 30 s window, the encoder's input
SAMPLES = FRAMES * HOP  # 480000, 30 s
# frames computed for a window: those that reach its samples (i * HOP - HALF < SAMPLES), for the floor of a
# window that is a whole file (``Span.ceiling`` None)
_COMPUTED = (SAMPLES + HALF) // HOP + 1
_EMPTY = np.zeros(0, dtype=np.float32)


@dataclass(frozen=True)
class Span:
    """One window to compute features for: ``audio`` (16 kHz float32, at most 30 s: more is cut), where it starts
    in its file (``start``, samples), the file's samples just before it (``before``: file[start - 200:start],
    fewer near the start) and after it (``after``: up to 200; fewer at the file's end, zeros follow), the
    file's loudest frame (``ceiling``: ``loudest_frame``'s; None: these samples are the whole file), and what
    the frames after a window shorter than 30 s read (``silence_after``): whisper's zeros (False), or the
    log-mel of silence, the floor (True: chunked long-form's chunks, ``log_mel``)."""

    audio: np.ndarray
    start: int = 0
    before: np.ndarray = field(default_factory=lambda: _EMPTY)
    after: np.ndarray = field(default_factory=lambda: _EMPTY)
    ceiling: float | None = None
    silence_after: bool = False

    @property
    def frames(self) -> int:
        """The window's content frames, whisper's ``segment_size``: len(audio) // 160, at most 3000."""
        return min(FRAMES, len(self.audio) // HOP)


def file_span(audio: np.ndarray, start: int = 0, length: int = SAMPLES, ceiling: float | None = None,
              filters=None, device="cpu") -> Span:
    """The window of a file held whole (``audio``) from sample ``start``, ``length`` samples (at most 30 s),
    with the samples around it; ``ceiling``: the file's loudest frame if known, else computed here (a pass
    over ``audio`` with ``filters``, ``loudest_frame``'s)."""
    end = min(len(audio), start + min(length, SAMPLES))
    return Span(audio[start:end], start, audio[max(0, start - HALF):start], audio[end:end + HALF],
                loudest_frame([audio], filters, device) if ceiling is None else ceiling)


def _reflection(head: np.ndarray) -> np.ndarray:
    """What ``torch.stft(center=True)`` puts before a file that starts with ``head`` (zeros after its end, as
    whisper pads it): file[200], file[199], ..., file[1]."""
    part = np.zeros(HALF, dtype=np.float32)
    got = np.asarray(head[1:HALF + 1], dtype=np.float32)
    part[:len(got)] = got
    return part[::-1].copy()


def as_span(window: np.ndarray | Span, filters=None, device="cpu") -> Span:
    """``window`` as a Span: a bare array is a whole file (over 30 s: its first window, floored by all of it,
    ``file_span``)."""
    if isinstance(window, Span):
        return window
    return Span(window) if len(window) <= SAMPLES else file_span(window, filters=filters, device=device)


def window_signal(span: Span) -> np.ndarray:
    """The samples that frames 0 to ``_COMPUTED - 1`` of ``span`` read: 200 before its start (the file's, or
    before the file's start its reflection), its audio, 200 after, zeros to (_COMPUTED - 1) * 160 + 400."""
    audio = np.asarray(span.audio[:SAMPLES], dtype=np.float32)
    after = np.asarray(span.after[:HALF], dtype=np.float32)
    before = np.asarray(span.before, dtype=np.float32)[-HALF:]
    if span.start < HALF:  # frame 0 reaches before the file: whisper's reflection of file[1:201]
        known = np.concatenate([before[len(before) - span.start:], audio, after])  # file[0:...]
        before = np.concatenate([_reflection(known)[span.start:], known[:span.start]])
    x = np.zeros((_COMPUTED - 1) * HOP + N_FFT, dtype=np.float32)
    x[HALF - len(before):HALF] = before
    x[HALF:HALF + len(audio)] = audio
    x[HALF + len(audio):HALF + len(audio) + len(after)] = after
    return x


def log_power(x, filters):
    """log10(max(mel power, 1e-10)) of the frames of ``x`` (torch, (..., samples), float32; frame k reads
    x[..., 160 k:160 k + 400]): (..., mels, frames). ``filters``: (mels, 201) float32 on x's device.

    |STFT|^2 with a periodic Hann window of 400 (``torch.stft``, center=False: the caller pads), then the mel
    filters and the log: whisper's ``log_mel_spectrogram`` before its floor."""
    import torch

    window = torch.hann_window(N_FFT, device=x.device)
    stft = torch.stft(x, N_FFT, HOP, window=window, center=False, return_complex=True)
    power = (stft.abs() ** 2).contiguous()  # contiguous: the matmul's fast path (transformers' note)
    return torch.clamp(filters @ power, min=1e-10).log10()


def mel_filters(extractor, device="cpu"):
    """The feature extractor's mel filters as (mels, 201) float32 on ``device`` (transformers', slaney)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(extractor.mel_filters.T, dtype=np.float32)).to(device)


def _padded(blocks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    """A file's blocks as whisper's STFT reads them: its reflection first, then the file, then 400 zeros (the
    first of whisper's 30 s of zeros: every frame that reaches the file's samples)."""
    blocks = iter(blocks)
    head = _EMPTY
    for block in blocks:
        head = np.concatenate([head, np.asarray(block, dtype=np.float32)])
        if len(head) > HALF:
            break
    yield _reflection(head)
    yield head
    yield from blocks
    yield np.zeros(N_FFT, dtype=np.float32)


def loudest_frame(blocks: Iterable[np.ndarray], filters=None, device="cpu") -> float:
    """max over a file's log-mel frames of log10(max(mel power, 1e-10)) (whisper's ``log_spec.max()``, the
    floor being 8 below it), the file given as consecutive blocks of samples, one block in memory at a time.
    ``filters``: ``mel_filters``' (None: 80 mels). The frames past whisper's that read only zeros are -10,
    the least a frame can be, so counting a few more than whisper does cannot change the maximum."""
    import torch

    if filters is None:
        filters = _default_filters(device)
    best, carry = -10.0, _EMPTY
    with torch.no_grad():
        for piece in _padded(blocks):
            x = np.concatenate([carry, piece])
            n = (len(x) - N_FFT) // HOP + 1 if len(x) >= N_FFT else 0
            if n > 0:
                signal = torch.from_numpy(x[:(n - 1) * HOP + N_FFT]).to(device)
                best = max(best, float(log_power(signal, filters).max()))
            carry = x[n * HOP:]
    return best


def _default_filters(device="cpu"):
    """Whisper's 80 mel filters (transformers' ``WhisperFeatureExtractor()`` defaults)."""
    from transformers import WhisperFeatureExtractor

    return mel_filters(WhisperFeatureExtractor(feature_size=80), device)


def log_mel(spans: list[Span], filters, device="cpu"):
    """Whisper's features of ``spans``: (windows, mels, 3000) float32 torch on ``device``.

    L = log_power of each window's frames; floor = ceiling - 8 (the file's loudest frame, or the window's own
    when ``ceiling`` is None: its samples are the whole file); (max(L, floor) + 4) / 4; frames from
    ``Span.frames`` on are 0 (whisper's ``pad_or_trim`` after the normalisation), or (floor + 4) / 4 where
    ``Span.silence_after``: the value of a silent frame, what the model reads after audio padded with zeros
    before the log-mel, as it was trained (a chunk cut at a pause, then silence). Measured on speech-long's
    chunked long-form (bfloat16, plain, 8 chunks a batch): WER 4.57% with zeros after each chunk, 4.19% with
    the floor, and as many tokens (2,922 and 2,913)."""
    import torch

    x = torch.from_numpy(np.stack([window_signal(s) for s in spans])).to(device)
    with torch.no_grad():  # not inference tensors: the features feed models that keep autograd
        logs = log_power(x, filters)  # (windows, mels, _COMPUTED)
        own = logs.amax(dim=(1, 2))
        ceilings = torch.tensor([np.float32(s.ceiling) if s.ceiling is not None else 0.0 for s in spans],
                                dtype=torch.float32, device=x.device)
        given = torch.tensor([s.ceiling is not None for s in spans], device=x.device)
        floor = (torch.where(given, ceilings, own) - 8.0)[:, None, None]
        feats = (torch.maximum(logs, floor) + 4.0) / 4.0
        content = torch.arange(_COMPUTED, device=x.device)[None, :] < torch.tensor([s.frames for s in spans],
                                                                                   device=x.device)[:, None]
        silent = torch.tensor([s.silence_after for s in spans], device=x.device)[:, None, None]
        after = torch.where(silent, (floor + 4.0) / 4.0, 0.0)  # (windows, 1, 1): a silent frame's value, or 0
        return torch.where(content[:, None, :], feats, after)[..., :FRAMES].contiguous()
