"""From a model reference (hub id, local folder or embedded name) to configs, tokenizers and models.

All three kinds go through the same ``from_pretrained`` path: an embedded model is first converted to a
local folder (``embedded.embedded_path``), a hub model is read from the Hugging Face cache or downloaded
(on a machine with internet).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import TandemError
from . import embedded

SOURCES = ("hub", "local", "embedded")
DTYPES = ("float32", "bfloat16", "float16")


class ModelUnavailableError(TandemError, RuntimeError):
    """A model cannot be had right now (not downloaded and offline, folder missing, package missing)."""


@dataclass(frozen=True)
class ModelRef:
    """Where one model's weights come from."""

    source: str  # "hub" (a model hub id), "local" (a folder) or "embedded" (shipped in a registry package)
    id: str  # hub id, folder path, or embedded name
    revision: str | None = None  # hub only: branch, tag or commit

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"{self.source}:{self.id}{rev}"


def _hub_cached_folder(ref: ModelRef) -> Path | None:
    """The snapshot folder holding this hub model's config.json in the local cache, if there is one."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(ref.id, "config.json", revision=ref.revision)
    return Path(found).parent if isinstance(found, str) else None


def is_available_offline(ref: ModelRef) -> bool:
    """True when the weights can be had without a network: cached, on disk, or installed."""
    if ref.source == "embedded":
        return embedded.is_installed(ref.id)
    if ref.source == "local":
        return (Path(ref.id) / "config.json").is_file() or (Path(ref.id) / "assistant.json").is_file()
    return _hub_cached_folder(ref) is not None


def how_to_get(ref: ModelRef) -> str:
    """What a user does to make ``ref`` available offline (the command, or where it comes from)."""
    if ref.source == "embedded":
        return f"install its packages: {embedded.install_command(ref.id)}"
    if ref.source == "local":
        return f"put a transformers model folder (or a Whisper assistant from tandem distill) at {ref.id}"
    return "needs the model hub once (run it where there is internet; it is cached)"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


HUB_TIMEOUT_S = 2.0  # how long we wait to learn that the model hub cannot be reached


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the model hub (``HF_ENDPOINT``, default huggingface.co:443) opens within
    ``timeout`` seconds, name lookup included (run in a thread: a lookup cannot be given a timeout). Asked
    once per process, before a hub model that is not cached is fetched, so that a machine without network
    learns it in seconds instead of after the hub client's retries."""
    import socket
    import threading
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme != "http" else 80)
    ok: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(ok)


def _unreachable(ref: ModelRef, why: str) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"{ref} is not in the local cache and {why}: download it once on a machine with internet "
        f"(`hf download {ref.id}`, then copy ~/.cache/huggingface) or name a local folder for it in models.yaml "
        f"({{local: PATH}}); `tandem models` lists the pairs available offline"
    )


def resolve(ref: ModelRef) -> tuple[str, dict]:
    """What to hand ``from_pretrained``: a path or hub id, and keyword arguments (revision, offline)."""
    if ref.source == "embedded":
        try:
            return str(embedded.embedded_path(ref.id)), {}
        except embedded.EmbeddedModelError as exc:
            raise ModelUnavailableError(str(exc)) from None
    if ref.source == "local":
        if (Path(ref.id) / "assistant.json").is_file():  # a Whisper assistant as ``tandem distill`` exports it
            try:
                return str(embedded.distilled_path(Path(ref.id))), {}
            except embedded.EmbeddedModelError as exc:
                raise ModelUnavailableError(str(exc)) from None
        if not (Path(ref.id) / "config.json").is_file():
            raise ModelUnavailableError(f"model folder {ref.id} has no config.json")
        return ref.id, {}
    kwargs: dict = {"revision": ref.revision} if ref.revision else {}
    cached = _hub_cached_folder(ref)
    if cached is not None:
        kwargs["local_files_only"] = True
    elif _offline():
        raise _unreachable(ref, "HF_HUB_OFFLINE is set (the model hub is not asked)")
    elif not hub_reachable():
        raise _unreachable(ref, f"the model hub cannot be reached (no connection within {HUB_TIMEOUT_S:.0f} s)")
    return ref.id, kwargs


def _hub_failure(ref: ModelRef, exc: Exception) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"{ref} could not be loaded ({exc.__class__.__name__}); it needs the model hub or a local copy"
    )


def _from_pretrained(factory, ref: ModelRef, **extra):
    """``factory.from_pretrained`` on the resolved reference; hub failures become ModelUnavailableError."""
    where, kwargs = resolve(ref)
    try:
        return factory.from_pretrained(where, **kwargs, **extra)
    except (OSError, ValueError) as exc:
        raise _hub_failure(ref, exc) from None


def load_config(ref: ModelRef):
    from transformers import AutoConfig

    return _from_pretrained(AutoConfig, ref)


def load_generation_config(ref: ModelRef):
    """The model's generation_config.json (transformers' GenerationConfig), without its weights."""
    from transformers import GenerationConfig

    return _from_pretrained(GenerationConfig, ref)


def load_tokenizer(ref: ModelRef):
    from transformers import AutoTokenizer

    return _from_pretrained(AutoTokenizer, ref)


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_model(ref: ModelRef, dtype: str = "float32", device: str = "cpu"):
    """The model in eval mode on ``device`` (``devices.resolve_device``), with the auto class its config names
    (seq2seq, speech seq2seq or causal)."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq, WhisperForCausalLM

    config = load_config(ref)
    if config.model_type == "whisper":
        cls = AutoModelForSpeechSeq2Seq if config.is_encoder_decoder else WhisperForCausalLM
    elif config.is_encoder_decoder:
        cls = AutoModelForSeq2SeqLM
    else:
        cls = AutoModelForCausalLM
    return _from_pretrained(cls, ref, dtype=torch_dtype(dtype)).to(device).eval()
