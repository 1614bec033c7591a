"""The decoder factory: which adapter serves a model's family.

It sits above the adapters it picks from (``decoders``, ``whisper``, ``causal``, ``causal_draft``), so that
none of them imports it back.
"""

from __future__ import annotations

from .causal import FixedCausalDecoder, fits
from .causal_draft import CausalDraftDecoder, can_draft
from .decoders import BartFamilyDecoder, CausalDecoder, Decoder, T5Decoder
from .llamacpp import LlamaCppDecoder
from .whisper import WhisperDecoder, WhisperDraftDecoder

__all__ = ["BART_FAMILY", "as_decoder"]

BART_FAMILY = ("bart", "mbart", "marian", "m2m_100", "pegasus", "nllb")


def as_decoder(model, assistant: bool = False, int8: bool = False) -> Decoder:
    """The adapter for ``model``'s family; unknown families are refused with the list of known ones.
    ``assistant``: the model only drafts, so a lean forward may serve it (Whisper; Llama-layout causal LMs
    when ``int8``), with int8 weights when ``int8`` (and the CPU supports them)."""
    if hasattr(model, "new_context"):  # a GGUF file on llama.cpp (models.llamacpp): the main model only
        return LlamaCppDecoder(model)
    kind = model.config.model_type
    if kind == "whisper":
        return WhisperDraftDecoder(model, int8) if assistant else WhisperDecoder(model)
    if kind in BART_FAMILY:
        return BartFamilyDecoder(model)
    if kind in ("t5", "mt5"):
        return T5Decoder(model)
    if not model.config.is_encoder_decoder:
        if assistant:
            return CausalDraftDecoder(model) if int8 and can_draft(model) else CausalDecoder(model)
        return FixedCausalDecoder(model) if fits(model.config) else CausalDecoder(model)
    raise TypeError(f"no engine adapter for {kind!r} encoder-decoder models (known: whisper, t5, mt5, {', '.join(BART_FAMILY)})")
