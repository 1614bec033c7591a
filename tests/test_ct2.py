import struct

import numpy as np
import pytest

from pipelines.models.ct2 import CT2FormatError, read_ct2


def _str(s: str) -> bytes:
    raw = s.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _var(name: str, arr: np.ndarray, code: int) -> bytes:
    data = arr.tobytes()
    return (_str(name) + struct.pack("<B", arr.ndim) + struct.pack("<" + "I" * arr.ndim, *arr.shape)
            + struct.pack("<BI", code, len(data)) + data)


def _model(variables: list[bytes], aliases=(), version=6) -> bytes:
    out = struct.pack("<I", version) + _str("WhisperSpec") + struct.pack("<II", 3, len(variables))
    out += b"".join(variables) + struct.pack("<I", len(aliases))
    for a, t in aliases:
        out += _str(a) + _str(t)
    return out


def test_reads_shapes_dtypes_and_aliases():
    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    heads = np.array(8, dtype=np.int16)
    blob = _model([_var("decoder/embeddings/weight", w, 4), _var("decoder/num_heads", heads, 2)],
                  aliases=[("decoder/projection/weight", "decoder/embeddings/weight")])
    model = read_ct2(blob)
    assert model.spec == "WhisperSpec" and model.version == 6
    np.testing.assert_array_equal(model.variables["decoder/embeddings/weight"], w)
    assert model.variables["decoder/projection/weight"] is model.variables["decoder/embeddings/weight"]
    assert int(model.variables["decoder/num_heads"]) == 8


def test_bfloat16_is_widened_to_float32():
    values = np.array([1.5, -2.25, 3.0], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    model = read_ct2(_model([_var("x", bf16, 5)]))
    np.testing.assert_array_equal(model.variables["x"], values)


@pytest.mark.parametrize("cut", [3, 20, -5])
def test_truncated_file_is_a_format_error(cut):
    blob = _model([_var("x", np.zeros(4, dtype=np.float32), 0)])
    with pytest.raises(CT2FormatError):
        read_ct2(blob[:cut])


def test_unknown_version_and_trailing_bytes():
    blob = _model([_var("x", np.zeros(2, dtype=np.float32), 0)])
    with pytest.raises(CT2FormatError, match="version"):
        read_ct2(struct.pack("<I", 99) + blob[4:])
    with pytest.raises(CT2FormatError, match="trailing"):
        read_ct2(blob + b"xx")
