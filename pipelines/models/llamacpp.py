"""The GGUF file's own blocks on llama.cpp's kernels: a text pair's main model in dtype ``q4_k_m``.

The embedded Qwen models ship as Q4_K_M GGUF files (``embedded_gguf``). Tandem's other dtypes read them
dequantized by transformers; this one runs the file itself through llama.cpp (the ``gguf`` extra:
llama-cpp-python, whose low-level API is a ctypes mirror of ``llama.h``), so a step reads the same ~1.1 GB of
Q4_K / Q6_K blocks llama.cpp reads, with llama.cpp's own CPU kernels. The engine drives it through
``engine.llamacpp.LlamaCppDecoder`` (fixed-width passes, one llama.cpp context per row); this module only
loads the file and wraps a context's calls: decode a run of tokens at given positions, forget positions,
read the logits.

Errors: ``ModelUnavailableError`` when llama-cpp-python is not installed, the pair's main model is not a GGUF
file Tandem ships, or llama.cpp cannot load the file or make a context.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .loading import ModelRef, ModelUnavailableError, load_config, load_generation_config

DTYPE = "q4_k_m"  # the dtype name: the GGUF file type of the embedded Qwen models (llama.cpp's own name)
EXTRA = "pip install -e '.[gguf]'"
BATCH = 512  # tokens a llama.cpp call takes at most (longer runs are split; the split depends on the run alone)
GGML_TYPE_BF16 = 30  # ggml.h's enum value (llama-cpp-python's mirror names only some types)


def import_llama_cpp():
    """The ``llama_cpp`` module with its log quiet. Raises ``ModelUnavailableError`` when it is not installed."""
    try:
        import llama_cpp
        from llama_cpp import _logger
    except ImportError:
        raise ModelUnavailableError(f"--dtype {DTYPE} runs the GGUF file on llama.cpp: llama-cpp-python is not "
                                    f"installed ({EXTRA})") from None
    _logger.set_verbose(False)
    return llama_cpp


def gguf_file(ref: ModelRef) -> Path:
    """The GGUF file of embedded text model ``ref`` (its registry parts joined once into the cache as
    ``models/<name>-gguf/model.gguf``, size and sha256 checked). Raises ``ModelUnavailableError`` for a model
    that is not a GGUF file Tandem ships."""
    from .. import paths
    from .cache import build_into
    from .embedded_gguf import GGUF, GGUF_NAME, join_parts

    if ref.source != "embedded" or ref.id not in GGUF:
        raise ModelUnavailableError(f"--dtype {DTYPE} runs a GGUF file Tandem ships ({', '.join(GGUF)}); "
                                    f"the main model is {ref}")
    spec = GGUF[ref.id]
    final = paths.models_dir() / f"{ref.id}-gguf"
    return build_into(final, lambda tmp: join_parts(spec, tmp / GGUF_NAME), spec.sha256, GGUF_NAME) / GGUF_NAME


class LlamaContext:
    """One llama.cpp context holding one sequence (seq 0): its KV cache and a token batch of ``BATCH``.

    Flash attention on and the KV cache in bfloat16 (llama.cpp's defaults: flash attention where the backend
    has it, a float16 cache): ggml's CPU flash attention splits one query's keys across threads (another sum
    order than for 2 or 3 queries) only for float16/float32 caches of 512 positions or more, so with bfloat16
    a token's logits are the same bits in a pass of 1, 2 or 3 tokens (``engine.llamacpp``). The cache rounds
    keys and values to bfloat16's 8 significant bits instead of float16's 11: summaries and translations can
    differ from llama.cpp's defaults by a token where two were nearly tied."""

    def __init__(self, model: LlamaCppModel, n_ctx: int) -> None:
        lib = model.lib
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, BATCH, BATCH, 1
        params.n_threads = params.n_threads_batch = model.threads
        params.no_perf = True
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.type_k = params.type_v = GGML_TYPE_BF16
        self.lib, self.n_ctx, self.vocab, self.max_tokens = lib, n_ctx, model.vocab_size, BATCH
        self.ctx = lib.llama_init_from_model(model.handle, params)
        if not self.ctx:
            raise ModelUnavailableError(f"llama.cpp could not make a context of {n_ctx} tokens for {model.path}")
        self.memory = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(BATCH, 0, 1)

    def clear(self) -> None:
        """Forget every position (a new request)."""
        self.lib.llama_memory_clear(self.memory, True)

    def forget_from(self, position: int) -> None:
        """Forget positions ``position`` onwards (rejected drafts, padding): the next call writes them again."""
        self.lib.llama_memory_seq_rm(self.memory, 0, position, -1)

    def decode(self, tokens: list[int], start: int, outputs: int, last: bool = False) -> np.ndarray | None:
        """Run ``tokens`` at positions ``start``, ``start + 1``, ... (at most ``BATCH``) into the KV cache; the
        logits (outputs, V) float32 of the first ``outputs`` tokens, or with ``last`` (1, V) of the last token
        alone, copied out (the next call overwrites them); None for no logits. Raises RuntimeError when
        llama.cpp refuses the batch (no room in the cache: the caller sized it)."""
        batch, n = self.batch, len(tokens)
        batch.n_tokens = n
        for i, token in enumerate(tokens):
            wanted = i == n - 1 if last else i < outputs
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, start + i, 1, wanted
            batch.seq_id[i][0] = 0
        status = self.lib.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status} for {n} tokens at position {start} (context {self.n_ctx})")
        rows = 1 if last else outputs
        if not rows:
            return None
        return np.ctypeslib.as_array(self.lib.llama_get_logits(self.ctx), shape=(rows, self.vocab)).copy()

    def close(self) -> None:
        if self.ctx:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:
        self.close()


@dataclass
class LlamaCppModel:
    """A GGUF model loaded by llama.cpp, seen by the rest of Tandem through its transformers ``config`` and
    ``generation_config`` (read from the converted folder of the same model: token ids, limits) and
    ``new_context``. ``threads``: llama.cpp's threads for every call (torch's count, as the peers use)."""

    path: Path
    config: object
    generation_config: object
    threads: int
    lib: object
    handle: object
    vocab_size: int

    def new_context(self, n_ctx: int) -> LlamaContext:
        """A fresh context of ``n_ctx`` positions (flash attention, its KV cache in bfloat16: ``LlamaContext``)."""
        return LlamaContext(self, n_ctx)

    def close(self) -> None:
        if self.handle:
            self.lib.llama_model_free(self.handle)
            self.handle = None


def load_llamacpp(ref: ModelRef, threads: int) -> LlamaCppModel:
    """``ref``'s GGUF file loaded by llama.cpp (weights memory-mapped, CPU only), with the config and generation
    config of its transformers folder. Raises ``ModelUnavailableError`` (module docstring)."""
    lib = import_llama_cpp()
    path = gguf_file(ref)
    config, generation = load_config(ref), load_generation_config(ref)
    lib.llama_backend_init()
    params = lib.llama_model_default_params()
    params.n_gpu_layers = 0
    handle = lib.llama_model_load_from_file(str(path).encode(), params)
    if not handle:
        raise ModelUnavailableError(f"llama.cpp could not load {path}")
    vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(handle))
    return LlamaCppModel(path, config, generation, threads, lib, handle, int(vocab))


__all__ = ["DTYPE", "LlamaContext", "LlamaCppModel", "gguf_file", "import_llama_cpp", "load_llamacpp"]
