"""The spoken part of the distillation corpus: which sentences, which voices, and a recipe per clip from
which its audio is synthesised again, sample for sample, on any machine with the same synthesisers.

Sentences come from Debian's English package descriptions (``pipelines.debian``) and, since 2026-12-04, from
Debian's ``fortunes`` package (quotations, literature, humour: the everyday words real speech uses and software
descriptions lack; new clips draw them about half the time), 5-30 plain words, none that an evaluation set
holds. A sentence is addressed by (package, Description-md5, index of the sentence in that description), or
for a fortune ("fortunes/FILE", md5 of the file's text, index of the sentence in the file): the md5 names the
text exactly, so an address either gives the same sentence or nothing (the package left the index or its
text changed: the clip is skipped and counted). Held-out sentences are chosen by a hash of their text (1 in
64), so the split stays the same as the index changes from release to release.

A recipe fixes everything random about a clip: the voice (flite kal/kal16/awb/rms/slt at a speed and
pitch, or Piper joe at a speed, noise scales 0: deterministic), the gain, the white noise (SNR and seed),
and for a 30 s window of long-form speech the lead-in silence, the pauses between sentences and where the
window is cut.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..audio import SAMPLE_RATE
from ..synthesis import PIPER_DETERMINISTIC, Speaker

if TYPE_CHECKING:
    from ..debian import TextFile

WINDOW_SECONDS = 30.0
FLITE_VOICES = {"kal": (85, 125), "kal16": (85, 125), "awb": (90, 130), "rms": (80, 120), "slt": (150, 210)}
HELDOUT_ONE_IN = 64

SentenceRef = tuple[str, str, int]  # (package, Description-md5, sentence index in the long description)

_CLEAN = re.compile(r"^[A-Za-z][A-Za-z0-9 ,.;:'()!?-]+[.!?]$")


@dataclass(frozen=True)
class Sentences:
    """The usable sentences of the index: text by address (every address), and the draw pools split into
    held-out and training (one address per distinct text, the first in (package, md5, index) order; a
    source's addresses in order, ``corpus_sentences``' training pool repeating the fortunes' to weight them)."""

    text: dict[SentenceRef, str]
    train: list[SentenceRef]
    heldout: list[SentenceRef]


def fortune_sentences(exclude: set[str], files: list[TextFile] | None = None) -> Sentences:
    """Sentences of 5-30 plain words from Debian's fortune files (``debian.read_fortunes``; ``files``: those
    instead), minus ``exclude``; a file's fortunes are split at their ``%`` lines, each one's lines joined, its
    sentences counted in order through the file. Raises ``debian.DataBuildError`` where the package cannot be
    fetched."""
    from ..debian import read_fortunes

    files = sorted(files if files is not None else read_fortunes(), key=lambda f: f.name)
    return addressed((((f"{f.package}/{f.name}", f.md5), fortune_pieces(f.text)) for f in files), exclude)


def fortune_pieces(text: str) -> list[str]:
    """A fortune file's sentences in order: split at its ``%`` lines, each fortune's lines joined."""
    return [s for fortune in re.split(r"^%$", text, flags=re.M) for s in split_sentences(" ".join(fortune.split()))]


def corpus_sentences(exclude: set[str], lists_dir: Path | None = None, fortunes: list[TextFile] | None = None) -> Sentences:
    """The corpus's sentences: Debian's descriptions (``debian_sentences``) and fortunes (``fortune_sentences``)
    by address; the training pool draws a fortune about as often as a description (the smaller pool's
    addresses repeated), a sentence in both once, as a description."""
    described, told = debian_sentences(exclude, lists_dir), fortune_sentences(exclude, fortunes)
    seen = set(described.text.values())
    told_train = [r for r in told.train if told.text[r] not in seen]
    weight = max(1, round(len(described.train) / max(len(told_train), 1)))
    return Sentences({**told.text, **described.text}, described.train + told_train * weight,
                     described.heldout + [r for r in told.heldout if told.text[r] not in seen])


def split_sentences(long: str) -> list[str]:
    """A description's sentences, in order (the index in a ``SentenceRef`` counts these)."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", long)]


def is_heldout(text: str) -> bool:
    """Whether a sentence belongs to the held-out part: the first byte of its SHA-256 modulo 64 is 0."""
    return hashlib.sha256(text.encode("utf-8")).digest()[0] % HELDOUT_ONE_IN == 0


def debian_sentences(exclude: set[str], lists_dir: Path | None = None) -> Sentences:
    """Sentences of 5-30 plain words (no URLs) from Debian's English descriptions, minus ``exclude`` (the
    evaluation sets' sentences). Raises ``debian.DataBuildError`` where the index cannot be fetched."""
    from ..debian import read_index

    index = sorted(read_index(lists_dir), key=lambda d: (d.package, d.md5))
    return addressed((((d.package, d.md5), split_sentences(d.long)) for d in index), exclude)


def addressed(texts, exclude: set[str]) -> Sentences:
    """The usable sentences of ``texts``, ((package, md5), its sentences in order) each: those of 5-30 plain
    words (no URLs) not in ``exclude``, addressed (package, md5, index). Every address resolves (a recipe's
    sentence stays found when another text gains it); the draw pools hold one address per distinct sentence,
    the first in (package, md5, index) order."""
    text: dict[SentenceRef, str] = {}
    first: dict[str, SentenceRef] = {}
    for (package, md5), sentences in texts:
        for i, s in enumerate(sentences):
            if s in exclude or not 5 <= len(s.split()) <= 30 or not _CLEAN.match(s) or "http" in s:
                continue
            text[(package, md5, i)] = s
            first.setdefault(s, (package, md5, i))
    refs = sorted(first.values())
    return Sentences(text, [r for r in refs if not is_heldout(text[r])], [r for r in refs if is_heldout(text[r])])


@dataclass(frozen=True)
class Recipe:
    """Everything that makes one clip's audio from its sentences."""

    kind: str  # "clip" (1-2 sentences, decoded without timestamps) or "window" (30 s of long-form, with them)
    sentences: tuple[SentenceRef, ...]
    voice: str  # "flite:NAME" or "piper:joe"
    settings: tuple[tuple[str, float], ...]  # flite --setf features or Piper SynthesisConfig fields
    gain: float
    noise_snr: float | None  # dB; None: no noise
    noise_seed: int
    lead: float = 0.0  # window: seconds of silence before the first sentence
    pauses: tuple[float, ...] = ()  # window: seconds of silence after each sentence
    cut: float = WINDOW_SECONDS  # seconds of audio kept

    def to_json(self) -> dict:
        return {"kind": self.kind, "sentences": [list(r) for r in self.sentences], "voice": self.voice,
                "settings": dict(self.settings), "gain": self.gain, "noise_snr": self.noise_snr,
                "noise_seed": self.noise_seed, "lead": self.lead, "pauses": list(self.pauses), "cut": self.cut}

    @classmethod
    def from_json(cls, d: dict) -> Recipe:
        return cls(d["kind"], tuple((p, m, int(i)) for p, m, i in d["sentences"]), d["voice"],
                   tuple(sorted(d["settings"].items())), d["gain"], d["noise_snr"], d["noise_seed"], d["lead"],
                   tuple(d["pauses"]), d["cut"])


def _voice(rng: random.Random) -> tuple[str, tuple[tuple[str, float], ...]]:
    """A random voice: Piper joe at a random speed (30%), or a flite voice at a random speed and pitch."""
    if rng.random() < 0.3:
        return "piper:joe", (("length_scale", round(rng.uniform(0.85, 1.25), 2)),)
    name = rng.choice(sorted(FLITE_VOICES))
    lo, hi = FLITE_VOICES[name]
    return f"flite:{name}", (("duration_stretch", round(rng.uniform(0.85, 1.25), 2)),
                             ("int_f0_target_mean", rng.randint(lo, hi)))


def speak(speaker: Speaker, voice: str, settings: tuple[tuple[str, float], ...], text: str, tmp: Path) -> np.ndarray:
    """One stretch of speech, 16 kHz mono float32, trimmed."""
    if voice.startswith("piper:"):
        return speaker.render(voice, text, tmp, piper_config={**PIPER_DETERMINISTIC, **dict(settings)})
    return speaker.render(voice, text, tmp, flite_setf=dict(settings))


def make_recipe(rng: random.Random, pool: list[SentenceRef], text: dict[SentenceRef, str], speaker: Speaker,
                tmp: Path, spoken: dict[str, np.ndarray] | None = None) -> Recipe:
    """A short clip (60%) or a 30 s window of sentences and pauses (40%), drawn with ``rng``. A window takes
    sentences until 32 s are spoken, so its recipe needs their lengths: each is synthesised once here, and
    kept in ``spoken`` (sentence -> samples) for ``render`` when given."""
    voice, settings = _voice(rng)
    if rng.random() < 0.6:
        sentences = tuple(rng.choice(pool) for _ in range(rng.choice((1, 1, 2))))
        gain, snr, seed = _draw_augmentation(rng)
        return Recipe("clip", sentences, voice, settings, gain, snr, seed)
    # long-form windows start just before speech (the previous window ended at a segment)
    lead = round(rng.uniform(0.0, 0.8), 3)
    sentences, pauses, t = [], [], lead
    while t < WINDOW_SECONDS + 2:
        ref = rng.choice(pool)
        pause = round(rng.uniform(0.4, 1.2), 3)
        sentences.append(ref)
        pauses.append(pause)
        speech = speak(speaker, voice, settings, text[ref], tmp)
        if spoken is not None:
            spoken[text[ref]] = speech
        t += len(speech) / SAMPLE_RATE + pause
    gain, snr, seed = _draw_augmentation(rng)
    # a final window of a recording is shorter: keep a fifth of the windows whole but short
    cut = WINDOW_SECONDS if rng.random() < 0.8 else round(rng.uniform(8.0, WINDOW_SECONDS), 3)
    return Recipe("window", tuple(sentences), voice, settings, gain, snr, seed, lead, tuple(pauses), cut)


def _draw_augmentation(rng: random.Random) -> tuple[float, float | None, int]:
    gain = round(rng.uniform(0.3, 1.0), 4)
    snr = round(rng.uniform(25, 40), 2) if rng.random() < 0.3 else None
    return gain, snr, rng.randrange(2**31)


def render(recipe: Recipe, text: dict[SentenceRef, str], speaker: Speaker, tmp: Path,
           spoken: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """The clip's audio, 16 kHz mono float32: the sentences spoken (a clip: as one utterance; a window: one by
    one with the lead-in and pauses), times the gain, plus white noise at the SNR, cut at ``recipe.cut``.
    Noise: n ~ N(0, 1) from ``numpy.random.default_rng(noise_seed)``, scaled to power P / 10^(SNR / 10),
    P the mean power of the gained speech. ``spoken``: a window's sentences already synthesised with this
    recipe's voice (``make_recipe``), used instead of speaking them again."""
    words = [text[r] for r in recipe.sentences]
    if recipe.kind == "clip":
        audio = speak(speaker, recipe.voice, recipe.settings, " ".join(words), tmp)
    else:
        pieces = [np.zeros(int(recipe.lead * SAMPLE_RATE), np.float32)]
        for w, pause in zip(words, recipe.pauses):
            speech = spoken[w] if spoken and w in spoken else speak(speaker, recipe.voice, recipe.settings, w, tmp)
            pieces += [speech, np.zeros(int(pause * SAMPLE_RATE), np.float32)]
        audio = np.concatenate(pieces)
    out = audio.astype(np.float32) * np.float32(recipe.gain)
    if recipe.noise_snr is not None and len(out):
        power = float(np.mean(out.astype(np.float64) ** 2)) + 1e-12
        noise = np.random.default_rng(recipe.noise_seed).standard_normal(len(out)).astype(np.float32)
        out = out + noise * np.float32(np.sqrt(power / 10 ** (recipe.noise_snr / 10)))
    return out[: int(recipe.cut * SAMPLE_RATE)].astype(np.float32)


def audio_sha256(audio: np.ndarray) -> str:
    """The hash of a clip's samples (float32, little-endian): a changed synthesiser shows here."""
    return hashlib.sha256(np.ascontiguousarray(audio, dtype="<f4").tobytes()).hexdigest()


def synthesis_versions() -> dict[str, str]:
    """The synthesisers' versions (flite's ``--version`` line, the piper-tts package), recorded with each shard."""
    import importlib.metadata
    import shutil
    import subprocess

    out = {}
    if shutil.which("flite"):
        banner = subprocess.run(["flite", "--version"], capture_output=True, text=True).stdout
        out["flite"] = next((ln.split(":", 1)[1].strip() for ln in banner.splitlines() if "version:" in ln), banner.strip())
    try:
        out["piper-tts"] = importlib.metadata.version("piper-tts")
    except importlib.metadata.PackageNotFoundError:
        pass
    return out
