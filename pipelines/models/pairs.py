"""A registry pair made runnable: its models loaded once, and an engine that drafts the way the pair says.

The loaded objects are shared (e.g. held by a Streamlit resource cache) and never mutated per request:
per-request state lives inside each ``generate`` call.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

from ..devices import (
    GGUF_DTYPE,
    HALF_UNITS,
    TORCH_WEIGHT_DTYPES,
    compute_dtype,
    half_is_native,
    int8_allowed,
    resolve_dtype,
)
from ..engine import AssistedDecoder, Decoder, as_decoder, model_drafter, prompt_lookup
from .loading import load_config, load_model, load_tokenizer
from .registry import Pair, RegistryError, preflight


@dataclass(frozen=True)
class LoadedPair:
    pair: Pair
    dtype: str
    device: str  # where the models live: "cpu", "cuda:0" (devices.resolve_device)
    main_model: object  # the transformers model (q4_k_m: a models.llamacpp.LlamaCppModel)
    main: Decoder
    tokenizer: object
    assistant_model: object | None
    engine: AssistedDecoder  # drafts as the pair says
    plain: AssistedDecoder  # the same main model, plain decoding (for --compare and --no-assistant)


def pad_id_of(model) -> int:
    config, gen = model.config, model.generation_config
    for value in (gen.pad_token_id, config.pad_token_id, gen.eos_token_id, config.eos_token_id):
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


def engine_for(loaded: LoadedPair, draft: str) -> AssistedDecoder:
    """An engine over ``loaded``'s main model that drafts as ``draft`` says (none | model | prompt-lookup |
    model+prompt-lookup); the model kinds need the pair's assistant. Benchmarks use it to compare drafters.
    Prompt lookup drafts from matches of 1 to ``prompt_lookup_ngram`` tokens; on a main decoder whose passes
    are as wide as their tokens (``Decoder.narrow_passes``: q4_k_m), where a rejected draft costs most of a
    step, only from full ``prompt_lookup_ngram``-token matches (summarize-own: 91% of those drafts accepted,
    69% of all; docs/benchmarks.md)."""
    pair, pad = loaded.pair, pad_id_of(loaded.main_model)
    make = None
    min_ngram = pair.prompt_lookup_ngram if loaded.main.narrow_passes else 1
    if draft.startswith("model"):
        if loaded.assistant_model is None:
            raise ValueError(f"pair {pair.name!r} has no assistant to draft with")
        lookup = pair.prompt_lookup_ngram if draft == "model+prompt-lookup" else None
        int8 = pair.assistant_int8 and int8_allowed(loaded.device)  # a CPU kernel: elsewhere the compute dtype
        make = model_drafter(as_decoder(loaded.assistant_model, assistant=True, int8=int8),
                             pair.share_encoder, pad, lookup, min_ngram)
    elif draft == "prompt-lookup":
        make = prompt_lookup(pair.prompt_lookup_ngram, min_ngram)
    return AssistedDecoder(loaded.main, make, pad)


def check_pair(pair: Pair) -> None:
    """RegistryError when the pair's pre-flight (``registry.preflight``: configs and tokenizers, no weights) fails;
    a pair it cannot check offline passes here and meets loading's own error."""
    verdict = preflight(pair)
    if verdict.ok is False:
        raise RegistryError(f"pair {pair.name!r} fails its pre-flight check: {'; '.join(verdict.problems)} "
                            "(tandem models lists every pair's checks)")


def check_gguf(pair: Pair) -> None:
    """RegistryError unless ``pair``'s main model is a GGUF file Tandem ships (what ``q4_k_m`` runs), and
    ModelUnavailableError without llama-cpp-python: both before any weights load."""
    from .embedded_gguf import GGUF
    from .llamacpp import import_llama_cpp

    if pair.main.source != "embedded" or pair.main.id not in GGUF:
        raise RegistryError(f"pair {pair.name!r}: --dtype {GGUF_DTYPE} runs the GGUF file of an embedded text model "
                            f"({', '.join(GGUF)}) on llama.cpp; its main model is {pair.main}")
    import_llama_cpp()


def check_quantizable(pair: Pair) -> None:
    """RegistryError unless ``pair``'s main model is one int8/int4 weights are offered for: a decoder-only model
    the fixed-shape causal decoder runs (``engine.causal.fits``) or Whisper (``engine.whisper``), whose decoders
    run their linear layers as modules (``quantize.quantize_model`` replaces them)."""
    from ..engine.causal import fits

    config = load_config(pair.main)
    if config.model_type != "whisper" and (config.is_encoder_decoder or not fits(config)):
        raise RegistryError(f"pair {pair.name!r}: int8/int4 weights are offered for Whisper and Llama-layout text "
                            f"models (Qwen2, Llama, Mistral) only, not {config.model_type!r}; use float32 or bfloat16")


def load_pair(pair: Pair, dtype: str | None = None, device: str = "cpu") -> LoadedPair:
    """Load the pair's main model (and assistant) on ``device`` (``devices.resolve_device``) in ``dtype``
    (default: ``devices.resolve_dtype``'s, the pair's own on a CPU) and build its engines. RegistryError, before
    any weights load, for a pair whose pre-flight (``registry.preflight``: configs and tokenizers) fails, e.g. an
    assistant with another tokenizer, which could only draft tokens the main model does not mean.
    int8/int4 (``devices.WEIGHT_DTYPES``, a CPU only): the models load in ``devices.compute_dtype``'s dtype and
    their decoder linears are quantized (``quantize.quantize_model``; Whisper's encoder and the heads stay in the
    compute dtype): the main model's, and the assistant's unless the pair drafts with the lean int8 assistant
    (``assistant_int8``), which has int8 weights of its own.
    q4_k_m (a CPU only): the main model is the pair's GGUF file on llama.cpp (``llamacpp.load_llamacpp``); the
    assistant loads as for int8/int4, unquantized (or the lean int8 one)."""
    check_pair(pair)
    dtype = resolve_dtype(device, dtype, pair.dtype)
    compute = compute_dtype(device, dtype)  # int8/int4: the weights' storage; the products run in this
    if dtype in TORCH_WEIGHT_DTYPES:
        check_quantizable(pair)
    elif dtype == GGUF_DTYPE:
        check_gguf(pair)
    if not half_is_native(device, compute):
        warnings.warn(f"{compute} is emulated on this CPU (none of {', '.join(HALF_UNITS[compute])} in /proc/cpuinfo): "
                      "several times slower than float32, whose outputs are just as exact (commands' --dtype float32)",
                      RuntimeWarning, stacklevel=2)
    if dtype == GGUF_DTYPE:  # the GGUF file itself on llama.cpp, with torch's thread count
        import torch

        from .llamacpp import load_llamacpp

        main_model = load_llamacpp(pair.main, torch.get_num_threads())
    else:
        main_model = load_model(pair.main, compute, device)
    assistant_model = load_model(pair.assistant, compute, device) if pair.draft.startswith("model") else None
    if dtype in TORCH_WEIGHT_DTYPES:
        from .quantize import quantize_model

        quantize_model(main_model, dtype)
        if assistant_model is not None and not pair.assistant_int8:  # (the lean int8 drafter has its own weights)
            quantize_model(assistant_model, dtype)
    main = as_decoder(main_model)
    pad = pad_id_of(main_model)
    loaded = LoadedPair(
        pair=pair, dtype=dtype, device=device, main_model=main_model, main=main, tokenizer=load_tokenizer(pair.main),
        assistant_model=assistant_model, engine=AssistedDecoder(main, None, pad), plain=AssistedDecoder(main, None, pad),
    )
    return replace(loaded, engine=engine_for(loaded, pair.draft))
