"""whisper.cpp's ggml model file, written from a transformers Whisper folder (the benchmarks' whisper.cpp peer).

This is whisper.cpp's own converter, ``models/convert-h5-to-ggml.py`` (ggerganov/whisper.cpp at f0d2bfb), as a
function, with its ``quantize`` tool (``examples/quantize``, ``ggml_common_quantize_0``) folded in:

- header: magic ``ggml``, 11 int32 hyper-parameters (vocab, audio ctx, d_model, heads, layers, text ctx, d_model,
  heads, layers, mel bins, ftype), then the mel filter bank (n_mel x n_fft float32), then the byte-level BPE
  vocabulary (int32 length + bytes per token, in id order);
- every tensor of the state dict except ``proj_out.weight`` (tied to the token embedding), renamed to OpenAI's
  names (``encoder.blocks.0.attn.query.weight``...): int32 n_dims, name length, ggml type, the dimensions
  innermost first, the name, the data. Float16 except 1-D tensors, the conv biases (reshaped to [n, 1]) and the
  positional embeddings, which stay float32;
- quantized forms (``q8_0``, ``q5_1``): every 2-D tensor but the conv biases and positional embeddings goes
  through ggml's own ``ggml_quantize_chunk`` (the libggml that pywhispercpp ships), and the header's ftype is
  ``GGML_QNT_VERSION * 1000 + ftype`` as the quantize tool writes it.

The mel filters are the ones transformers' feature extractor computes for the folder (librosa's slaney filters,
what ``whisper/assets/mel_filters.npz`` holds), since the OpenAI repository is not at hand offline.
"""

from __future__ import annotations

import ctypes
import glob
import json
import struct
from pathlib import Path

import numpy as np

# ggml.h: tensor types, file types (MOSTLY_*), the quantization format version
GGML_TYPE = {"f32": 0, "f16": 1, "q5_1": 7, "q8_0": 8}
GGML_FTYPE = {"f32": 0, "f16": 1, "q8_0": 7, "q5_1": 9}
GGML_QNT_VERSION, GGML_QNT_VERSION_FACTOR = 2, 1000
KEEP_FLOAT = {"encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding",
              "decoder.positional_embedding"}
CONV_MAP = {
    "self_attn.k_proj": "attn.key", "self_attn.q_proj": "attn.query", "self_attn.v_proj": "attn.value",
    "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln", "encoder_attn.q_proj": "cross_attn.query",
    "encoder_attn.v_proj": "cross_attn.value", "encoder_attn.out_proj": "cross_attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0", "fc2": "mlp.2", "final_layer_norm": "mlp_ln",
    "encoder.layer_norm.bias": "encoder.ln_post.bias", "encoder.layer_norm.weight": "encoder.ln_post.weight",
    "encoder.embed_positions.weight": "encoder.positional_embedding",
    "decoder.embed_positions.weight": "decoder.positional_embedding",
    "decoder.layer_norm.bias": "decoder.ln.bias", "decoder.layer_norm.weight": "decoder.ln.weight",
    "decoder.embed_tokens.weight": "decoder.token_embedding.weight",
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable character table (the tokenizer's byte-level alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def openai_name(name: str) -> str:
    """A transformers state-dict name (``model.encoder.layers.0.fc1.weight``) -> OpenAI's (``encoder.blocks.0.mlp.0.weight``)."""
    parts = name.split(".")[1:]
    if parts[1] == "layers":
        inner = ".".join(parts[3:-1])
        if inner == "encoder_attn.k_proj":
            mapped = "attn.key" if parts[0] == "encoder" else "cross_attn.key"
        else:
            mapped = CONV_MAP[inner]
        return ".".join([parts[0], "blocks", parts[2], mapped, parts[-1]])
    joined = ".".join(parts)
    return CONV_MAP.get(joined, joined)


def _libggml() -> ctypes.CDLL:
    """pywhispercpp's libggml-base (its wheel bundles it under a hashed name), with ggml_quantize_chunk typed."""
    import pywhispercpp

    found = glob.glob(str(Path(pywhispercpp.__file__).parent.parent / "pywhispercpp.libs" / "libggml-base-*.so*"))
    if not found:
        raise OSError("pywhispercpp's libggml-base is not where its wheel puts it: cannot quantize")
    lib = ctypes.CDLL(found[0])
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


def quantize_rows(lib: ctypes.CDLL, qtype: str, data: np.ndarray) -> bytes:
    """``data`` (rows x n_per_row, n_per_row a multiple of 32) -> ggml ``qtype`` blocks, by ggml's own code.
    q8_0: per block of 32 values one float16 scale d = max|x| / 127 and 32 int8 round(x / d) (34 bytes);
    q5_1: per block of 32 a float16 scale and minimum and 32 5-bit codes (24 bytes)."""
    src = np.ascontiguousarray(data, dtype=np.float32)
    dst = ctypes.create_string_buffer(src.nbytes + 1024)
    n = lib.ggml_quantize_chunk(GGML_TYPE[qtype], src.ctypes.data, dst, 0, src.shape[0], src.shape[1], None)
    return dst.raw[:n]


def write_ggml(folder: Path, out: Path, precision: str = "f16") -> None:
    """Write ``folder``'s Whisper (config.json, model.safetensors, tokenizer.json, preprocessor_config.json) as a
    whisper.cpp model file ``out`` in ``precision`` (f16, f32, q8_0 or q5_1; see the module docstring)."""
    from safetensors import safe_open
    from transformers import WhisperFeatureExtractor

    config = json.loads((folder / "config.json").read_text())
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf8"))["model"]["vocab"]
    filters = WhisperFeatureExtractor.from_pretrained(folder).mel_filters.T.astype(np.float32)  # n_mel x n_fft
    lib = _libggml() if precision in ("q8_0", "q5_1") else None
    ftype = GGML_FTYPE[precision] + (GGML_QNT_VERSION * GGML_QNT_VERSION_FACTOR if lib else 0)
    decoder = {v: k for k, v in _bytes_to_unicode().items()}
    hparams = [config["vocab_size"], config["max_source_positions"], config["d_model"],
               config["encoder_attention_heads"], config["encoder_layers"], config.get("max_length") or
               config.get("max_target_positions", 448), config["d_model"], config["decoder_attention_heads"],
               config["decoder_layers"], config["num_mel_bins"], ftype]
    with open(out, "wb") as f, safe_open(str(folder / "model.safetensors"), "np") as weights:
        f.write(struct.pack("i", 0x67676D6C) + struct.pack("11i", *hparams))
        f.write(struct.pack("ii", *filters.shape) + filters.tobytes())
        f.write(struct.pack("i", len(vocab)))
        for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
            text = bytes(decoder[c] for c in token)
            f.write(struct.pack("i", len(text)) + text)
        for src in weights.keys():
            if src == "proj_out.weight":
                continue
            name, data = openai_name(src), weights.get_tensor(src).squeeze()
            if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
                data = data.reshape(data.shape[0], 1)
            kind = "f16" if precision != "f32" and data.ndim >= 2 and name not in KEEP_FLOAT else "f32"
            if lib is not None and data.ndim == 2 and name not in KEEP_FLOAT:
                kind, blob = precision, quantize_rows(lib, precision, data.astype(np.float16).astype(np.float32))
            else:
                blob = data.astype(np.float16 if kind == "f16" else np.float32).tobytes()
            encoded = name.encode()
            f.write(struct.pack("iii", data.ndim, len(encoded), GGML_TYPE[kind]))
            f.write(struct.pack(f"{data.ndim}i", *reversed(data.shape)) + encoded + blob)
