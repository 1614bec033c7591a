"""A reader for CTranslate2 ``model.bin`` files (binary versions 5 and 6).

Layout, little-endian: ``u32 version``, ``str spec_name``, ``u32 revision``, ``u32 n_variables``, then
per variable ``str name``, ``u8 rank``, ``rank x u32 shape``, ``u8 dtype``, ``u32 nbytes``, raw data;
then ``u32 n_aliases`` and pairs of ``str`` (alias, target). A ``str`` is ``u16 length`` (counting a
trailing NUL) and the bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import TandemError

# CTranslate2 dtype codes -> numpy dtypes (bf16 has no numpy dtype: read as uint16 and widened below).
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: np.uint16}


class CT2FormatError(TandemError, ValueError):
    """The bytes are not a CTranslate2 model.bin this reader understands."""


@dataclass(frozen=True)
class CT2Model:
    spec: str  # e.g. "WhisperSpec"
    version: int  # binary format version
    variables: dict[str, np.ndarray]  # name -> array (aliases resolved to their target's array)


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise CT2FormatError("model.bin ends early (truncated file?)")
        out = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return out

    def string(self) -> str:
        (n,) = self.unpack("H")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.rstrip(b"\0").decode("utf-8")

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise CT2FormatError("model.bin ends early (truncated file?)")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out


def read_ct2(data: bytes | memoryview) -> CT2Model:
    """Parse a whole model.bin held in memory. Arrays are views on ``data`` where the dtype allows."""
    cur = _Cursor(memoryview(data))
    (version,) = cur.unpack("I")
    if version not in (5, 6):
        raise CT2FormatError(f"unsupported CTranslate2 binary version {version} (expected 5 or 6)")
    spec = cur.string()
    cur.unpack("I")  # spec revision
    (n_vars,) = cur.unpack("I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(n_vars):
        name = cur.string()
        (rank,) = cur.unpack("B")
        shape = cur.unpack("I" * rank) if rank else ()
        (code,) = cur.unpack("B")
        (nbytes,) = cur.unpack("I")
        if code not in _DTYPES:
            raise CT2FormatError(f"variable {name!r} has unknown dtype code {code}")
        arr = np.frombuffer(cur.take(nbytes), dtype=_DTYPES[code]).reshape(shape)
        if code == 5:  # bfloat16: the high half of a float32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        variables[name] = arr
    (n_alias,) = cur.unpack("I")
    for _ in range(n_alias):
        alias, target = cur.string(), cur.string()
        if target not in variables:
            raise CT2FormatError(f"alias {alias!r} points at missing variable {target!r}")
        variables[alias] = variables[target]
    if cur.pos != len(cur.buf):
        raise CT2FormatError(f"{len(cur.buf) - cur.pos} trailing bytes after the last alias")
    return CT2Model(spec=spec, version=version, variables=variables)
