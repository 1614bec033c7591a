"""Shared fixtures. Built artefacts (converted models, evaluation sets) live in the normal Tandem cache
(``$TANDEM_CACHE`` or ~/.cache/tandem) so a second run reuses them; tests that damage a cache work on a
private copy under tmp_path."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session", autouse=True)
def _two_threads():
    """Two torch threads; with pytest-xdist workers (``-n N``) the cores are shared out among them."""
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // workers)))


@pytest.fixture(scope="session")
def registry():
    from pipelines.models.registry import load_registry

    return load_registry()


@pytest.fixture(scope="session")
def base_dir():
    from pipelines.models.embedded import embedded_path

    return embedded_path("whisper-base")


@pytest.fixture(scope="session")
def speech_real():
    from pipelines.quality.sets import build_set, read_manifest

    build_set("speech-real")
    return read_manifest("speech-real")


@pytest.fixture(scope="session")
def base_runner(registry):
    from pipelines.asr import WhisperRunner

    return WhisperRunner(registry.get("whisper-base"))


@pytest.fixture(scope="session")
def distilled_asr(registry):
    """(WhisperRunner, Pair) of whisper-base+distilled, the default speech pair: loaded once a worker."""
    from pipelines.asr import WhisperRunner

    pair = registry.get("whisper-base+distilled")
    return WhisperRunner(pair), pair


@pytest.fixture(scope="session")
def local_models_file(tmp_path_factory):
    """A models file of small local BART/T5/M2M100/Marian pairs (see tests/local_models.py)."""
    from local_models import build_local_models

    return build_local_models(tmp_path_factory.mktemp("local-models"))
