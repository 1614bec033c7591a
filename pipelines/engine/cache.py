"""The ragged KV cache: one forward call for a batch whose rows sit at different positions.

Rows of a batch accept different numbers of drafted tokens, so after a round their sequences have
different lengths. We never move cached keys and values to realign them. Instead every row keeps all
slots it ever wrote, and a validity mask says which slots hold real tokens; rejected drafts and padding
become holes. A forward call then needs, per row, the true position of each new token (for the position
embeddings) and a 4-D attention mask:

    allowed[b, q, s] = valid[b, s]                         for a cached slot s < T
                     = real[b, s - T] and s - T <= q       for a new slot (causal within the chunk)

Holes cost attention work only; when more than half of the slots are holes the cache is compacted
(real slots gathered to the front, per row).

T5 has no absolute positions but a relative position bias, computed here from each slot's true
position (kept per slot) so holes do not distort distances.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .rows import from_host


@dataclass(frozen=True)
class EncoderOutput:
    hidden: torch.Tensor  # (B, S, D) encoder last hidden state
    mask: torch.Tensor | None  # (B, S) 1 for real source tokens, or None when every position is real

    def select(self, rows: torch.Tensor) -> EncoderOutput:
        return EncoderOutput(self.hidden.index_select(0, rows), None if self.mask is None else self.mask.index_select(0, rows))


def chunk_tensors(chunks: list[list[int]], pad_id: int, device: torch.device,
                  width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, n) and real-token flags (B, n) of ``chunks`` (one list a row, padded with ``pad_id`` to
    the longest, n at least ``width``), built on the host and copied to ``device`` once."""
    n = max(width, max(len(c) for c in chunks))
    ids = from_host([c + [pad_id] * (n - len(c)) for c in chunks], torch.long, device)
    real = from_host([[j < len(c) for j in range(n)] for c in chunks], torch.bool, device)
    return ids, real


class RaggedCache:
    """A transformers cache plus, per row, which slots are real and the next true position."""

    def __init__(self, cache, batch: int, device: torch.device) -> None:
        self.cache = cache
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)  # (B, T)
        self.slot_pos = torch.zeros(batch, 0, dtype=torch.long, device=device)  # (B, T) true position of each slot
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
        self._planned: torch.Tensor | None = None  # positions of the chunk being fed
        self._real: list[int] | None = [0] * batch  # real slots per row, kept on the host while commits give counts

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def tensors_of(self, chunks: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return chunk_tensors(chunks, pad_id, self.valid.device)

    def plan(self, real: torch.Tensor, max_pos: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions (B, n) and the 4-D mask (B, 1, n, T + n) for feeding a chunk whose real tokens are
        ``real`` (B, n) (real tokens first in each row); computed on the device."""
        batch, n = real.shape
        device = self.valid.device
        positions = self.next_pos[:, None] + torch.arange(n, device=device)[None, :]
        if max_pos is not None:
            positions = positions.clamp(max=max_pos - 1)  # padding slots only; real tokens stay in range
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        new = causal[None, :, :] & real[:, None, :]
        new = new | torch.eye(n, dtype=torch.bool, device=device)[None]  # a padding query sees itself: no empty rows
        old = self.valid[:, None, :].expand(batch, n, self.length)
        allowed = torch.cat([old, new], dim=2)[:, None, :, :]
        self._planned = positions
        return positions, allowed

    def commit(self, keep: torch.Tensor, counts: list[int] | None = None) -> None:
        """After a forward call over n new slots: ``keep`` (B, n) marks which of them hold accepted tokens
        (``counts``: its rows' sums where the caller knows them; they keep the hole count on the host)."""
        self.valid = torch.cat([self.valid, keep], dim=1)
        self.slot_pos = torch.cat([self.slot_pos, self._planned], dim=1)
        self.next_pos = self.next_pos + keep.sum(dim=1)
        self._real = None if counts is None or self._real is None else [r + c for r, c in zip(self._real, counts)]

    def commit_prefix(self, kept: list[int], n: int) -> None:
        """``commit`` of a chunk of ``n`` slots whose first ``kept[b]`` hold accepted tokens in row b."""
        self.commit(from_host([[j < k for j in range(n)] for k in kept], torch.bool, self.valid.device), kept)

    def write(self, kv, keys: torch.Tensor, values: torch.Tensor) -> None:
        """A lean drafter's chunk of keys and values (B, heads, n, Dh) after the layer's cached ones (``kv``: a
        ``LeanCache`` layer; the new slots are those ``plan`` gave the chunk)."""
        kv.keys = keys if kv.keys is None else torch.cat([kv.keys, keys], dim=2)
        kv.values = values if kv.values is None else torch.cat([kv.values, values], dim=2)

    def needs_cross(self) -> bool:
        """Whether a lean drafter must still compute the request's cross-attention keys and values."""
        return self.cache.cross is None

    def set_cross(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.cache.cross = pairs

    def add_counts(self, counts: list[int]) -> None:
        """Real slots committed without host counts (a drafter's device-fed steps), counted once known."""
        if self._real is not None:
            self._real = [r + c for r, c in zip(self._real, counts)]

    def rollback(self, row: int, n: int) -> None:
        """Turn the last ``n`` real slots of ``row`` into holes (rejected drafts) and step its position back."""
        counts = [0] * self.valid.shape[0]
        counts[row] = n
        self.rollback_rows(counts)

    def rollback_rows(self, counts: list[int]) -> None:
        """``rollback`` for every row at once: the last ``counts[b]`` real slots of row b become holes. The
        slots are found on the device: slot s is among a row's last n real ones when it is real and the
        number of real slots from s on, (total - cumsum before s), is at most n."""
        if not any(c > 0 for c in counts):
            return
        n = from_host(counts, torch.long, self.valid.device)
        real = self.valid.long()
        from_here = real.sum(dim=1, keepdim=True) - real.cumsum(dim=1) + real  # real slots at s and after it
        self.valid = self.valid & (from_here > n[:, None])
        self.next_pos = self.next_pos - n
        if self._real is not None:
            self._real = [r - c for r, c in zip(self._real, counts)]

    def reset_row(self, row: int) -> None:
        """Row ``row`` starts again (a continuous batch's join): its slots become holes, its position 0."""
        self.valid[row] = False
        self.next_pos[row] = 0
        if self._real is not None:
            self._real[row] = 0

    def select(self, rows: torch.Tensor, host_rows: list[int] | None = None, cross: bool = True) -> None:
        """Keep only ``rows`` (finished rows leave the batch and cost nothing more); ``host_rows``: the same
        indices as a list, when the caller has them (no read from the device); ``cross=False``: the
        cross-attention keys and values stay (each row's equals its source row's: beams of one input)."""
        reorder_cache(self.cache, rows, cross)
        if self._real is not None:
            self._real = [self._real[i] for i in (rows.tolist() if host_rows is None else host_rows)]
        self.valid = self.valid.index_select(0, rows)
        self.slot_pos = self.slot_pos.index_select(0, rows)
        self.next_pos = self.next_pos.index_select(0, rows)

    def release(self) -> None:
        """The request is over (a pooled static cache goes back to its pool; nothing to do here)."""

    def maybe_compact(self, threshold: float = 0.5) -> None:
        """Gather each row's real slots to the front when holes are more than ``threshold`` of the cache
        (0: whenever there is one)."""
        if not self.length:
            return
        if self._real is not None:  # counted on the host: no read from the device
            holes = 1.0 - sum(self._real) / (len(self._real) * self.length)
        else:
            holes = 1.0 - self.valid.float().mean().item()
        if holes <= threshold:
            return
        counts = self.valid.sum(dim=1)
        width = max(self._real) if self._real is not None else int(counts.max().item())
        # For each row, the source slot of every kept slot: real slots in order, then slot 0 as filler.
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :width]
        new_valid = torch.arange(width, device=self.valid.device)[None, :] < counts[:, None]
        for layer in _self_attention_layers(self.cache):
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        self.slot_pos = self.slot_pos.gather(1, order)
        self.valid = new_valid


def reorder_cache(cache, rows: torch.Tensor, cross: bool = True) -> None:
    """``cache.reorder_cache(rows)`` (a ``LeanCache`` or a transformers cache); ``cross=False``: only the
    self-attention keys and values (an encoder-decoder cache's cross-attention part stays)."""
    if cross:
        cache.reorder_cache(rows)
    elif isinstance(cache, LeanCache):
        cache.reorder_cache(rows, cross=False)
    else:
        getattr(cache, "self_attention_cache", cache).reorder_cache(rows)


def _self_attention_layers(cache):
    inner = getattr(cache, "self_attention_cache", cache)
    return inner.layers


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where attention is allowed, the dtype's lowest value elsewhere (softmax gives exactly 0 there)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


class _Layer:
    """One layer's self-attention keys and values (B, heads, T, head_dim), grown a chunk at a time."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None


class LeanCache:
    """The Whisper adapters' cache: self-attention keys/values per layer (compacted and reordered by
    ``RaggedCache`` like any other) and the cross-attention keys/values, computed once from the encoder
    output."""

    def __init__(self, layers: int) -> None:
        self.layers = [_Layer() for _ in range(layers)]
        self.cross: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def reorder_cache(self, rows: torch.Tensor, cross: bool = True) -> None:
        for layer in self.layers:
            if layer.keys is not None:
                layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
        if cross and self.cross is not None:
            self.cross = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cross]


