"""Offline evaluation sets, built from registry packages or from the project's own texts (third-party audio
and text are extracted at run time, never committed: see data/README.md).

Sets: speech-real, speech-synth, speech-long (``speech``), translate-udhr, summarize-own, summarize-debian
(``text``); where and how a set is kept: ``store``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from ...debian import DataBuildError
from .speech import (
    LONG_RECORDINGS,
    POCKETSPHINX,
    SYNTH_VOICES,
    build_speech_long,
    build_speech_real,
    build_speech_synth,
    project_sentences,
)
from .store import MANIFEST, PROJECT_DATA, SetInfo, build_atomically, is_built, read_manifest, set_dir
from .text import (
    DEBIAN_MAX_ITEMS,
    DEBIAN_MIN_WORDS,
    UDHR,
    UDHR_LANGUAGES,
    build_summarize_debian,
    build_summarize_own,
    build_translate_udhr,
    project_documents,
)

__all__ = ["MANIFEST", "SETS", "DataBuildError", "SetInfo", "build_set", "is_up_to_date", "project_documents",
           "project_sentences", "read_manifest", "set_dir"]

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


def _recipe(name: str) -> tuple[Callable[[Path], list[dict]], dict]:
    """A set's builder and recipe; the recipe includes the project texts' digests, so editing
    data/sentences.txt rebuilds the speech sets. DataBuildError for an unknown name."""
    if name not in SETS:
        raise DataBuildError(f"unknown set {name!r}; known: {', '.join(SETS)}")
    builder, recipe = SETS[name]
    recipe = dict(recipe)
    if "text" in recipe:
        recipe["text_sha"] = _text_digest(recipe["text"])
    return builder, recipe


def build_set(name: str, force: bool = False) -> SetInfo:
    """Build one set (or find it up to date)."""
    builder, recipe = _recipe(name)
    return build_atomically(name, recipe, builder, force)


def is_up_to_date(name: str) -> bool:
    """True when set ``name`` is built from its current recipe, so that ``build_set`` builds nothing."""
    return is_built(set_dir(name), _recipe(name)[1])
