"""Where the models run: the device, resolved once per process from ``--device`` or ``$TANDEM_DEVICE``, and the
dtype that goes with it. Both travel as plain values (``"cpu"``, ``"cuda:0"``; ``"float32"``, ...) from here to
``pairs.load_pair``, the summaries, the resume signatures, the evaluation environment and the regression key.

Sources: ``torch.cuda.is_available``, ``torch.cuda.device_count`` and ``torch.cuda.is_bf16_supported``.
"""

from __future__ import annotations

import os
import platform
import re
from functools import lru_cache

from .errors import TandemError

CHOICES = "auto, cpu, cuda or cuda:N"
ENV = "TANDEM_DEVICE"


class DeviceError(TandemError, ValueError):
    """The device asked for does not exist here (one sentence, for the command line's exit 2)."""


def resolve_device(requested: str | None = None) -> str:
    """The device to run on, as torch names it: ``"cpu"`` or ``"cuda:N"``.

    ``requested``: ``auto`` (CUDA device 0 when there is one, else the CPU), ``cpu``, ``cuda`` (device 0) or
    ``cuda:N``; None reads ``$TANDEM_DEVICE`` and defaults to ``auto``. Raises DeviceError for an unknown name,
    for CUDA on a machine without it, and for an index past the last device."""
    import torch

    name = (requested or os.environ.get(ENV) or "auto").strip().lower()
    if name == "cpu":
        return "cpu"
    if name == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match is None:
        raise DeviceError(f"unknown device {name!r}: choose {CHOICES}")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise DeviceError(f"device {name!r}: no CUDA device is available here (torch {torch.__version__}, {build}); "
                          f"use --device cpu or auto")
    index, count = int(match.group(1) or 0), torch.cuda.device_count()
    if index >= count:
        raise DeviceError(f"device {name!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return f"cuda:{index}"


# weight-only quantized dtypes: the weights' storage. int8, int4: torch's CPU kernels (models/quantize.py), the
# products in compute_dtype's; q4_k_m: the GGUF file's own Q4_K/Q6_K blocks on llama.cpp's kernels (models/llamacpp.py)
TORCH_WEIGHT_DTYPES = ("int8", "int4")
GGUF_DTYPE = "q4_k_m"
WEIGHT_DTYPES = TORCH_WEIGHT_DTYPES + (GGUF_DTYPE,)


def resolve_dtype(device: str, requested: str | None, pair_dtype: str) -> str:
    """The dtype: ``requested`` when given; else on a CPU the pair's own (``models.yaml``), on CUDA
    bfloat16 where the device supports it (float32's range: no overflow), else float16. The pairs' float32 is
    a CPU choice; a GPU's matrix units run half precision, and assisted output equals plain output in every
    dtype by construction (``engine/fixed.py``). Not yet measured against float16 on a GPU (issue 14).
    ``WEIGHT_DTYPES`` (int8, int4) run on a CPU only: DeviceError when requested on CUDA."""
    if requested in WEIGHT_DTYPES and device.startswith("cuda"):
        raise DeviceError(f"--dtype {requested}: weight-only {requested} runs on a CPU only (CPU kernels); "
                          "on CUDA use bfloat16 or float16, or --device cpu")
    if requested:
        return requested
    if not device.startswith("cuda"):
        return pair_dtype
    import torch

    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def compute_dtype(device: str, dtype: str) -> str:
    """The dtype products run in for ``dtype``: itself, or for a weight dtype (int8, int4) bfloat16 where the
    CPU multiplies it natively (``half_is_native``), else float32."""
    if dtype not in WEIGHT_DTYPES:
        return dtype
    return "bfloat16" if half_is_native(device, "bfloat16") else "float32"


def int8_allowed(device: str) -> bool:
    """Dynamic int8 quantization (``torch.ao`` quantized linear layers, the assistant's ``assistant_int8``) has
    CPU kernels only: on other devices the assistant keeps the compute dtype."""
    return device == "cpu"


# the /proc/cpuinfo flags of matrix or vector units that compute a half-precision product natively; without
# them torch's CPU kernels convert to float32 and back: bfloat16 then costs several times float32 (Whisper
# base's encoder, one 30 s window, one thread, on a 2-core AVX2-only AMD EPYC: 13.3 s bfloat16, 2.8 s float32)
# (Arm's /proc/cpuinfo names them in its "Features" line: bf16, asimdhp)
HALF_UNITS = {"bfloat16": ("amx_bf16", "avx512_bf16", "bf16"), "float16": ("amx_fp16", "avx512_fp16", "asimdhp")}


def half_is_native(device: str, dtype: str) -> bool:
    """Whether ``dtype`` products run natively on ``device``: always for float32 and on CUDA; on a CPU when
    ``/proc/cpuinfo`` lists one of ``HALF_UNITS[dtype]`` (False where that file is absent)."""
    if dtype == "float32" or device.startswith("cuda"):
        return True
    return any(flag in cpu_flags() for flag in HALF_UNITS.get(dtype, ()))


@lru_cache(maxsize=1)
def cpuinfo_fields() -> dict[str, str]:
    """The first processor's ``key: value`` lines of ``/proc/cpuinfo`` (up to its blank line; empty where that
    file is absent)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip() and fields:
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_flags() -> frozenset[str]:
    """The first processor's ``flags`` (x86) or ``Features`` (Arm) line of ``/proc/cpuinfo`` (empty where that
    file is absent)."""
    fields = cpuinfo_fields()
    return frozenset((fields.get("flags") or fields.get("Features") or "").split())


def cpu_info() -> tuple[str, str]:
    """This machine's CPU as (vendor, model name) from ``/proc/cpuinfo`` (``vendor_id``, ``model name``), e.g.
    ("GenuineIntel", "Intel(R) Xeon(R) Processor"); ("", ``platform.processor()``) where that file is absent."""
    fields = cpuinfo_fields()
    return fields.get("vendor_id", ""), fields.get("model name") or platform.processor()
