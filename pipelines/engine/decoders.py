"""Decoder adapters: one forward call for a batch whose rows sit at different positions.

The adapters run the families' own transformers modules (embeddings, decoder layers, heads) over the
ragged cache (``cache.RaggedCache``: per-row true positions and a 4-D mask that hides holes): causal LMs take
``position_ids`` natively; the BART family (BART, mBART, Marian, M2M100/NLLB, Pegasus) computes its position
embeddings from the cache length, so its adapter embeds tokens and positions itself and then calls the
family's decoder layers; T5's relative position bias is computed from each slot's true position. Whisper has
adapters of its own (``whisper``): a fixed-shape main decoder and a lean draft decoder. ``families.as_decoder``
picks the adapter for a model.
"""

from __future__ import annotations

import torch

from .cache import EncoderOutput, RaggedCache, additive_mask

__all__ = ["Decoder", "EncoderOutput", "RaggedCache"]


def _encoder_mask(enc: EncoderOutput, n: int, dtype: torch.dtype) -> torch.Tensor | None:
    if enc.mask is None:
        return None
    allowed = enc.mask.bool()[:, None, None, :].expand(-1, 1, n, -1)
    return additive_mask(allowed, dtype)


class Decoder:
    """One model seen as a decoder: ``encode`` (if it has an encoder), a fresh cache, and ``forward``
    over a chunk of new tokens per row returning float32 logits (B, n, V). An assistant with a reduced draft
    head returns logits over its draft vocabulary only: column c holds token ``vocab_ids[c]``."""

    fixed_batch = False  # True: the engine keeps finished rows in the batch (fixed shapes, see whisper.py)
    device_steps = True  # ``forward_ids`` takes device tensors (a ragged cache); False: host lists only
    # True: a pass is as wide as its tokens and each drafted token costs about a step more (llama.cpp's
    # narrow passes), so a draft likely to be rejected is not free; False: passes of a fixed width
    narrow_passes = False

    def __init__(self, model) -> None:
        self.model = model
        self.config = model.config
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.max_positions: int | None = None
        self.vocab_ids: tuple[int, ...] | None = None  # sorted ids of the logits' columns; None: every id
        self.compact_at = 0.5  # compact the cache when holes pass this share of it (RaggedCache.maybe_compact)

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(self.config.is_encoder_decoder)

    def encode(self, **inputs) -> EncoderOutput:
        raise TypeError(f"{self.model.__class__.__name__} has no encoder")

    def new_cache(self, batch: int, capacity: int | None = None) -> RaggedCache:
        """A cache for ``batch`` rows; ``capacity`` (positions a row may reach) matters to static caches only."""
        from transformers import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(DynamicCache(), DynamicCache()) if self.reads_encoder else DynamicCache()
        return RaggedCache(cache, batch, self.device)

    @property
    def reads_encoder(self) -> bool:
        return self.is_encoder_decoder

    def forward(self, chunks: list[list[int]], cache: RaggedCache, enc: EncoderOutput | None, pad_id: int,
                need_from: list[int] | None = None):
        """Logits (B, n, V) float32 for the new tokens ``chunks`` (one list a row) and the real-token flags (B, n).
        ``need_from``: per row, the first token whose logits are read (an adapter may skip the others)."""
        ids, real = cache.tensors_of(chunks, pad_id)
        return self.forward_ids(ids, real, cache, enc)

    def forward_ids(self, ids: torch.Tensor, real: torch.Tensor, cache: RaggedCache, enc: EncoderOutput | None):
        """``forward`` for chunks already on the device: token ids (B, n) and real-token flags (B, n), real
        tokens first in each row (a drafter feeds its own argmax back this way without reading it)."""
        positions, allowed = cache.plan(real, self.max_positions)
        self._ragged = cache  # T5 reads the slot positions for its relative position bias
        logits = self._forward(ids, positions, additive_mask(allowed, self.dtype), cache.cache, enc)
        return logits.float(), real

    def fused_choice(self, cache, logits: torch.Tensor, rules, offsets: list[int],
                     states: list[list[tuple[int, ...]]]) -> torch.Tensor | None:
        """Greedy verification's choice from a graph of the pass that returned ``logits`` (a fixed-shape
        decoder's static cache, ``fixed.FixedShapeDecoder.fused_choice``): not here."""
        return None

    def ready(self, cache, enc: EncoderOutput | None) -> None:
        """Per-request set-up before a draft loop's first step, so that it can replay (a lean Whisper drafter's
        cross-attention keys and values on a static cache): nothing here."""

    def fuses(self, ids: torch.Tensor, cache, enc: EncoderOutput | None) -> bool:
        """Whether a step over ``ids`` (B, n) and its epilogue run as one graph (``fused_step``; a lean
        drafter's static cache): not here."""
        return False

    def _forward(self, ids, positions, mask, cache, enc):  # pragma: no cover - abstract
        raise NotImplementedError


class BartFamilyDecoder(Decoder):
    """BART, mBART, Marian, M2M100/NLLB and Pegasus: the same decoder-layer template with different
    embeddings. Token and position embeddings are computed here (per-row positions), then the family's
    own layers, final layer norm and head run."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.decoder = model.get_decoder()
        self.kind = self.config.model_type
        self.embed_scale = getattr(self.decoder, "embed_scale", None)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> EncoderOutput:
        hidden = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return EncoderOutput(hidden, attention_mask)

    def _positions(self, positions: torch.Tensor) -> torch.Tensor:
        emb = self.decoder.embed_positions
        if self.kind == "m2m_100":  # sinusoidal table offset by padding_idx + 1
            return emb.weights.index_select(0, (positions + emb.padding_idx + 1).view(-1)).view(*positions.shape, -1)
        offset = getattr(emb, "offset", 0)  # BART/mBART learned positions start at 2
        return torch.nn.functional.embedding(positions + offset, emb.weight)

    def _forward(self, ids, positions, mask, cache, enc):
        dec = self.decoder
        hidden = dec.embed_tokens(ids)
        if self.kind in ("marian", "pegasus"):  # these scale outside the embedding module
            hidden = hidden * self.embed_scale
        hidden = hidden + self._positions(positions).to(hidden.dtype)
        if getattr(dec, "layernorm_embedding", None) is not None:
            hidden = dec.layernorm_embedding(hidden)
        enc_mask = _encoder_mask(enc, ids.shape[1], self.dtype)
        for layer in dec.layers:
            hidden = layer(hidden, mask, enc.hidden, encoder_attention_mask=enc_mask, cache=cache, use_cache=True)
            if isinstance(hidden, tuple):
                hidden = hidden[0]
        if getattr(dec, "layer_norm", None) is not None:
            hidden = dec.layer_norm(hidden)
        logits = self.model.lm_head(hidden)
        bias = getattr(self.model, "final_logits_bias", None)
        return logits + bias.to(logits.dtype) if bias is not None else logits


class CausalDecoder(Decoder):
    """Decoder-only language models (Llama, Qwen, GPT-2, ...): position ids and 4-D masks are native."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.max_positions = getattr(self.config, "max_position_embeddings", None)

    @property
    def reads_encoder(self) -> bool:
        return False

    def _forward(self, ids, positions, mask, cache, enc):
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        return out.logits


class T5Decoder(Decoder):
    """T5 / mT5 / Flan-T5: no absolute positions, but a relative position bias in self-attention. With holes
    in the cache the slot index is not the position, so the bias is computed here from each row's true
    positions: bias[b, h, q, s] = table[h, bucket(pos(s) - pos(q))], and handed to every layer."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.decoder = model.get_decoder()
        self.attention = self.decoder.block[0].layer[0].SelfAttention

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> EncoderOutput:
        hidden = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return EncoderOutput(hidden, attention_mask)

    def _bias(self, positions: torch.Tensor) -> torch.Tensor:
        att = self.attention
        keys = torch.cat([self._ragged.slot_pos, positions], dim=1)  # (B, T + n)
        relative = keys[:, None, :] - positions[:, :, None]  # (B, n, T + n): memory - context
        buckets = att._relative_position_bucket(relative, bidirectional=False, num_buckets=att.relative_attention_num_buckets,
                                                max_distance=att.relative_attention_max_distance)
        return att.relative_attention_bias(buckets).permute(0, 3, 1, 2)  # (B, H, n, T + n)

    def _forward(self, ids, positions, mask, cache, enc):
        dec = self.decoder
        hidden = dec.embed_tokens(ids)
        bias = self._bias(positions).to(hidden.dtype)
        enc_mask = _encoder_mask(enc, ids.shape[1], self.dtype)
        for block in dec.block:
            hidden, _, _ = block(hidden, attention_mask=mask, position_bias=bias, encoder_hidden_states=enc.hidden,
                                 encoder_attention_mask=enc_mask, cache=cache, use_cache=True)
        hidden = dec.final_layer_norm(hidden)
        if getattr(self.config, "scale_decoder_outputs", False):
            hidden = hidden * (self.model.model_dim ** -0.5)
        return self.model.lm_head(hidden)

