"""A main decoder on llama.cpp's kernels (a GGUF file's own quantized blocks), exact by fixed shapes.

The model is a ``models.llamacpp.LlamaCppModel``; each row of a request gets a llama.cpp context of its own
(one sequence, its own KV cache), lent from a pool by size. Assisted output equals plain output by the same
construction as ``fixed.FixedShapeDecoder``'s, on llama.cpp's side:
    - every pass of a row is one ``llama_decode`` of exactly ``width`` (W) tokens with the logits of all W read:
      a plain step is one token padded to W, a verify pass of more than W tokens takes several passes; so every
      matrix product of a row has the same shape (W columns; the output head W columns too) and takes the same
      kernel (ggml's per-column dot products of the quantized blocks), whatever the lookahead;
    - padding and rejected drafts are forgotten before the next pass (``llama_memory_seq_rm``), which writes
      the true tokens at those positions: the cache holds exactly positions 0 .. p - 1 when a pass starts at p,
      with the same values in the plain and the assisted run, in the same cells;
    - attention masks later positions with -inf: their softmax weights are exact zeros, so what the padding or
      the drafts after a token are does not touch its logits;
    - the prompt's tokens whose logits nobody reads go through one call of their own (at most the context's
      ``max_tokens`` a call), the same in both runs; rows never share a call, so a row's bits do not depend on the batch.
What is assumed (as of every GEMM in ``fixed``): within a product a column's bits do not depend on which of
the W columns it is; ``tests/test_text_qwen_gguf.py`` checks the whole property on the real model: a verify
pass's logits equal plain steps' bit for bit.
"""

from __future__ import annotations

import torch

from .cache import EncoderOutput
from .decoders import Decoder

# tokens per pass: on a 2-core AMD EPYC a pass of w tokens costs 38 / 60 / 86 / 109 ms for w = 1 / 2 / 3 / 4 (the
# Q4_K kernels are compute-bound: each column costs about as much as a step), so a draft pays only at a narrow
# width: summarize-own, 2 documents, prompt lookup: 15.6 s at width 2, 17.6 s at 3, 17.1 s at 4 (docs/benchmarks.md)
WIDTH = 2
CONTEXT_STEP = 256  # a row's context size is rounded up to this many positions (contexts are pooled by size)


class LlamaCppCache:
    """A request's rows on llama.cpp: a context per row and its next true position. Nothing is rolled back
    eagerly: a pass first forgets the row's positions from ``next_pos`` on."""

    def __init__(self, decoder: LlamaCppDecoder, contexts: list, width: int) -> None:
        self.decoder, self.contexts, self.width = decoder, contexts, width
        self.next_pos = [0] * len(contexts)
        for ctx in contexts:
            ctx.clear()

    def commit(self, keep: torch.Tensor, counts: list[int] | None = None) -> None:
        counts = keep.sum(dim=1).tolist() if counts is None else counts
        self.commit_prefix(counts, keep.shape[1])

    def commit_prefix(self, kept: list[int], n: int) -> None:
        """The first ``kept[b]`` tokens of row b's last chunk stay; the rest are forgotten by the next pass."""
        self.next_pos = [p + k for p, k in zip(self.next_pos, kept)]

    def rollback_rows(self, counts: list[int]) -> None:
        self.next_pos = [p - max(0, n) for p, n in zip(self.next_pos, counts)]

    def maybe_compact(self, threshold: float = 0.5) -> None:
        """Nothing to compact."""

    def release(self) -> None:
        """Give the contexts back to the decoder's pool (once)."""
        self.decoder.give_back(self.contexts)
        self.contexts = []


class LlamaCppDecoder(Decoder):
    """A ``LlamaCppModel`` as the main model (module docstring). Logits are float32 on the CPU, (B, n, V) with V
    the config's vocabulary (columns llama.cpp has no token for are -inf)."""

    fixed_batch = True  # rows stay for the whole request (their contexts are theirs)
    device_steps = False

    def __init__(self, model, width: int = WIDTH) -> None:
        self.model, self.config = model, model.config
        self.dtype, self.device = torch.float32, torch.device("cpu")
        self.max_positions = getattr(self.config, "max_position_embeddings", None)
        self.vocab_ids = None
        self.compact_at = 0.5
        self.width = width
        self.vocab = max(int(getattr(self.config, "vocab_size", 0) or 0), model.vocab_size)
        self._pool: dict[int, list] = {}

    @property
    def reads_encoder(self) -> bool:
        return False

    def new_cache(self, batch: int, capacity: int | None = None) -> LlamaCppCache:
        """A context per row for ``capacity`` positions (prompt + new tokens; plus a pass of padding), rounded up
        to ``CONTEXT_STEP``."""
        need = (capacity or self.max_positions or 4096) + self.width
        size = -(-need // CONTEXT_STEP) * CONTEXT_STEP
        free = self._pool.setdefault(size, [])
        contexts = [free.pop() if free else self.model.new_context(size) for _ in range(batch)]
        return LlamaCppCache(self, contexts, self.width)

    def give_back(self, contexts: list) -> None:
        for ctx in contexts:
            self._pool.setdefault(ctx.n_ctx, []).append(ctx)

    def forward(self, chunks: list[list[int]], cache: LlamaCppCache, enc: EncoderOutput | None, pad_id: int,
                need_from: list[int] | None = None):
        """Logits (B, n, V) float32 for ``chunks`` (one list of new tokens a row, n the longest) and the real-token
        flags (B, n) on the host. Row b's tokens before ``need_from[b]`` go through the prompt call (no logits:
        zeros in their columns); from there, passes of W tokens. A row with no tokens (finished) is not run."""
        batch, n = len(chunks), max(1, max(len(c) for c in chunks))
        width = cache.width
        logits = torch.zeros(batch, n, self.vocab, device=self.device)  # llama.cpp's logits: host memory
        real = torch.tensor([[j < len(c) for j in range(n)] for c in chunks], dtype=torch.bool, device="cpu")
        for b, chunk in enumerate(chunks):
            if not chunk:
                continue
            ctx, start = cache.contexts[b], cache.next_pos[b]
            need = min(max(0, (need_from or [0] * batch)[b]), len(chunk))
            ctx.forget_from(start)
            for first in range(0, need, ctx.max_tokens):  # the prompt call(s)
                ctx.decode(chunk[first : min(need, first + ctx.max_tokens)], start + first, outputs=0)
            for first in range(need, len(chunk), width):  # passes of exactly W tokens, every column's logits read
                tokens = chunk[first : first + width]
                out = ctx.decode(tokens + [pad_id] * (width - len(tokens)), start + first, outputs=width)
                ctx.forget_from(start + first + len(tokens))  # the padding's positions
                logits[b, first : first + len(tokens), : out.shape[1]] = torch.from_numpy(out[: len(tokens)])
        if self.vocab > self.model.vocab_size:  # ids past llama.cpp's vocabulary: never chosen
            logits[:, :, self.model.vocab_size :] = float("-inf")
        return logits, real
