"""A main decoder on llama.cpp's kernels (a GGUF file's own quantized blocks), exact by width-invariant passes.

The model is a ``models.llamacpp.LlamaCppModel``; each row of a request gets a llama.cpp context of its own
(one sequence, its own KV cache), lent from a pool by size. Assisted output equals plain output because a
token's logits are the same bits whichever pass computes them:
    - every pass of a row is one ``llama_decode`` of ``low`` to ``high`` tokens with the logits of all of them
      read (a pass shorter than ``low`` is padded to it; a verify chunk longer than ``high`` takes several
      passes), and the decoder only uses widths whose bits were found equal on this machine
      (``exact_widths``, below);
    - padding and rejected drafts are forgotten before the next pass (``llama_memory_seq_rm``), which writes
      the true tokens at those positions: the cache holds exactly positions 0 .. p - 1 when a pass starts at p,
      with the same values in the plain and the assisted run, in the same cells;
    - attention masks later positions with -inf; ggml's flash attention skips masked cells, so what the padding
      or the drafts after a token are does not touch its logits;
    - the prompt's tokens whose logits nobody reads go through one call of their own (at most the context's
      ``max_tokens`` a call) with the next token, whose logits it gives (the last prompt token's: the first
      token decoded); that call is the same in the plain and the assisted run, the drafts after it go through
      narrow passes in both; rows never share a call, so a row's bits do not depend on the batch.
Why widths 1-3 agree (llama.cpp 0.3.36's CPU backend, read in its source and measured on the real model): a
Q4_K/Q6_K product of fewer than 4 columns computes each column alone (ggml's repacked ``gemv``, or
``vec_dot`` per column: activations quantized per column), while 4 columns or more take the 4-column ``gemm``
with other bits; flash attention computes each query row alone, except a single query over 512 cached
positions or more in a float16/float32 cache, which splits the keys across threads (another sum order),
so the contexts keep their KV cache in bfloat16 (``models.llamacpp``). What other builds do (Intel's AMX
kernels may take another path for 1 column than for 2) is found at load by ``exact_widths``: where width 1
does not match wider passes, every pass is padded to 2 tokens, as all were in earlier releases.
``tests/test_text_qwen_gguf.py`` checks the property on the real model: a verify pass's logits equal plain
steps' bit for bit.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from .cache import EncoderOutput
from .decoders import Decoder

log = logging.getLogger(__name__)

# widest pass: 4 columns take ggml's 4-column gemm (other bits than 1-3); on a 2-core AMD EPYC a pass of w
# tokens costs 37.5 / 62.6 / 83.3 ms for w = 1 / 2 / 3 (the Q4_K kernels are compute-bound: each column costs
# about 2/3 of a step), so a draft pays only when it is accepted often (docs/benchmarks.md)
MAX_WIDTH = 3
FALLBACK_WIDTH = 2  # every pass padded to this many tokens where width 1 gives other bits than wider passes
CONTEXT_STEP = 256  # a row's context size is rounded up to this many positions (contexts are pooled by size)
PROBE = [9707, 11, 1879, 0, 576, 3974, 13, 1096, 374, 264, 1273, 315]  # any ids: 6 of a prefix, 6 compared


def exact_widths(model, probe: list[int] = PROBE, high: int = MAX_WIDTH) -> tuple[int, int]:
    """The pass widths ``(low, high)`` whose logits are bit-equal on this machine's build of llama.cpp: a
    short run of ``probe`` tokens is decoded after a prefix in passes of 1, 2, ... ``high`` tokens and each
    token's logits compared. ``(1, w)``: widths 1..w all agree (AMD EPYC: ``(1, 3)``); where width 1 differs
    from width 2, ``(2, w)`` for the widths 2..w that agree with 2, every pass padded to 2 tokens (Intel's AMX
    kernels may take another path for 1 column than for several); at worst ``(2, 2)``, the fixed shape of
    earlier releases. The run is then decoded once more with its first token alone in a pass, so that every
    token sits in another column of its pass: ``ModelUnavailableError`` when that changes a bit (no pass
    layout is exact on this build: bfloat16 is). About 1.2 s on 2 cores, at load; the KV cache paths that
    depend on its length are ruled out by the bfloat16 cache (module docstring) and checked by the
    real-weight test."""
    prefix, run = probe[:6], probe[6:]
    ctx = model.new_context(CONTEXT_STEP)

    def logits(width: int, lead: int = 0, low: int = 1) -> np.ndarray:
        """The run's logits from passes of ``width`` tokens, after a first pass of ``lead`` tokens (padded to
        ``low``); every pass padded to its width with its last token."""
        ctx.clear()
        ctx.decode(prefix, 0, outputs=0)
        cuts = ([0, lead] if lead else [0]) + list(range(lead + width, len(run), width)) + [len(run)]
        parts = []
        for i, j in zip(cuts, cuts[1:]):
            tokens, size = run[i:j], max(low, width if i >= lead else lead)
            out = ctx.decode(tokens + tokens[-1:] * (size - len(tokens)), len(prefix) + i, outputs=size)
            parts.append(out[: len(tokens)])
        return np.concatenate(parts)

    try:
        first = {1: logits(1), 2: logits(2)}
        low = 1 if np.array_equal(first[1], first[2]) else FALLBACK_WIDTH
        top = 2
        while top < high and np.array_equal(first[low], logits(top + 1)):
            top += 1
        shifted = logits(top, lead=1, low=low)
    finally:
        ctx.close()
    if not np.array_equal(first[low], shifted):
        from ..models.loading import ModelUnavailableError

        raise ModelUnavailableError("llama.cpp on this CPU gives a token other logits in another column of a pass: "
                                    "no pass layout keeps assisted output equal to plain in q4_k_m here; use "
                                    "--dtype bfloat16")
    if low > 1:
        log.warning("llama.cpp on this CPU gives a token other logits in a pass of 1 token than in a pass of 2: "
                    "every pass is padded to %d tokens (exact, but a plain step costs a 2-token pass)", low)
    return low, top


class LlamaCppCache:
    """A request's rows on llama.cpp: a context per row and its next true position. Nothing is rolled back
    eagerly: a pass first forgets the row's positions from ``next_pos`` on."""

    def __init__(self, decoder: LlamaCppDecoder, contexts: list) -> None:
        self.decoder, self.contexts = decoder, contexts
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
    the config's vocabulary (columns llama.cpp has no token for are -inf). ``width``: every pass exactly this
    many tokens (a profile's fixed shape); None: the widths ``exact_widths`` finds."""

    fixed_batch = True  # rows stay for the whole request (their contexts are theirs)
    device_steps = False

    def __init__(self, model, width: int | None = None) -> None:
        self.model, self.config = model, model.config
        self.dtype, self.device = torch.float32, torch.device("cpu")
        self.max_positions = getattr(self.config, "max_position_embeddings", None)
        self.vocab_ids = None
        self.compact_at = 0.5
        self.low, self.high = (width, width) if width else exact_widths(model)
        self.vocab = max(int(getattr(self.config, "vocab_size", 0) or 0), model.vocab_size)
        self._pool: dict[int, list] = {}

    @property
    def narrow_passes(self) -> bool:
        """Whether a plain step is a pass of 1 token (``Decoder.narrow_passes``)."""
        return self.low == 1

    @property
    def reads_encoder(self) -> bool:
        return False

    def new_cache(self, batch: int, capacity: int | None = None) -> LlamaCppCache:
        """A context per row for ``capacity`` positions (prompt + new tokens; plus a pass of padding), rounded up
        to ``CONTEXT_STEP``."""
        need = (capacity or self.max_positions or 4096) + self.high
        size = -(-need // CONTEXT_STEP) * CONTEXT_STEP
        free = self._pool.setdefault(size, [])
        contexts = [free.pop() if free else self.model.new_context(size) for _ in range(batch)]
        return LlamaCppCache(self, contexts)

    def give_back(self, contexts: list) -> None:
        for ctx in contexts:
            self._pool.setdefault(ctx.n_ctx, []).append(ctx)

    def forward(self, chunks: list[list[int]], cache: LlamaCppCache, enc: EncoderOutput | None, pad_id: int,
                need_from: list[int] | None = None):
        """Logits (B, n, V) float32 for ``chunks`` (one list of new tokens a row, n the longest) and the real-token
        flags (B, n) on the host. Row b's tokens before ``need_from[b]`` go through the prompt call with the
        token at ``need_from[b]`` (only its logits read: zeros in the others' columns); from there, passes of
        ``low`` to ``high`` tokens. A row with no tokens (finished) is not run."""
        batch, n = len(chunks), max(1, max(len(c) for c in chunks))
        logits = torch.zeros(batch, n, self.vocab, device=self.device)  # llama.cpp's logits: host memory
        real = torch.tensor([[j < len(c) for j in range(n)] for c in chunks], dtype=torch.bool, device="cpu")
        for b, chunk in enumerate(chunks):
            if not chunk:
                continue
            ctx, start = cache.contexts[b], cache.next_pos[b]
            need = min(max(0, (need_from or [0] * batch)[b]), len(chunk))
            ctx.forget_from(start)
            if need:  # the prompt call(s), the last one also giving the first needed token's logits
                head = min(need + 1, len(chunk))
                for first in range(0, head, ctx.max_tokens):
                    end = min(head, first + ctx.max_tokens)
                    out = ctx.decode(chunk[first:end], start + first, outputs=0, last=end > need)
                if head > need:
                    logits[b, need, : out.shape[1]] = torch.from_numpy(out[0])
                need = head
            for first in range(need, len(chunk), self.high):  # passes of low..high tokens, all logits read
                tokens = chunk[first : first + self.high]
                padded = tokens + [pad_id] * (self.low - len(tokens))
                out = ctx.decode(padded, start + first, outputs=len(padded))
                if len(padded) > len(tokens):
                    ctx.forget_from(start + first + len(tokens))  # the padding's positions
                logits[b, first : first + len(tokens), : out.shape[1]] = torch.from_numpy(out[: len(tokens)])
        if self.vocab > self.model.vocab_size:  # ids past llama.cpp's vocabulary: never chosen
            logits[:, :, self.model.vocab_size :] = float("-inf")
        return logits, real
