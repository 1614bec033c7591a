"""Drafters: what proposes the next few tokens of each row.

- ``ModelDrafter``: an assistant model run autoregressively with its own KV cache (ragged; a lean drafter's
  is static on CUDA, ``draft_cache``). It may read the
  main model's encoder output (a decoder-only assistant such as ``WhisperForCausalLM``, or an
  encoder-decoder assistant of the same ``d_model``), run its own encoder, or have none (a causal LM).
- ``PromptLookup``: n-gram matching against the row's source and output so far; no model.
- Both at once: rows where prompt lookup finds a continuation take it; the model drafts for the rest.

A drafter returns, per row, the drafted tokens and (when sampling) the distribution q each was drawn
from, so the verifier can apply the speculative-sampling rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .cache import RaggedCache
from .decoders import Decoder, EncoderOutput
from .draft_loop import draft_on_device
from .rows import from_host
from .rules import PAD_GEN_LEN, Rules, Sampling, apply_rules, to_probs


@dataclass
class Drafts:
    tokens: list[list[int]]  # per row
    probs: list[list[torch.Tensor]] | None  # per row, per token: the draft distribution q (sampling only)
    steps: int  # draft forward passes run
    seconds: float


class Drafter:
    """Per-request drafting state. A new one is made for every ``generate`` call (see ``DrafterFactory``)."""

    def start(self, prompts: list[list[int]], enc: EncoderOutput | None, encoder_inputs: dict | None) -> int:
        """Prepare for a batch; returns the number of encoder passes it ran itself."""
        return 0

    def draft(self, ks: list[int], seqs: list[list[int]], gen_lens: list[int], sampling: Sampling | None,
              generator: torch.Generator | None, stop_below: float | None) -> Drafts:
        raise NotImplementedError

    def update(self, drafted: list[list[int]], accepted: list[int], emitted: list[list[int]]) -> None:
        pass

    def select(self, keep: list[int], same_encoder: bool = False) -> None:
        """Keep rows ``keep``, in that order (finished rows leaving the batch, or beam search relabelling its
        beams). ``same_encoder``: row i and row ``keep[i]`` read the same encoder output (beams of one input)."""

    def join_row(self, row: int, prompt: list[int], enc: EncoderOutput | None) -> bool:
        """Give ``row`` to a new sequence of ``prompt`` reading ``enc`` (1, S, D) (a continuous batch's join):
        False where this drafter cannot reset one row (the caller then starts a fresh drafter on every row)."""
        return False

    def finish(self) -> None:
        """The request is over (a pooled static cache goes back to its pool)."""


class PromptLookup(Drafter):
    """Propose the tokens that followed the latest earlier occurrence of the row's last n tokens, searching
    the row's source tokens and its output so far (longest n first, from ``ngram`` down to ``min_ngram``;
    nothing when not even ``min_ngram`` tokens match)."""

    def __init__(self, ngram: int = 3, min_ngram: int = 1) -> None:
        self.ngram, self.min_ngram = ngram, min(min_ngram, ngram)
        self.sources: list[list[int]] = []

    def start(self, prompts, enc, encoder_inputs) -> int:
        ids = (encoder_inputs or {}).get("input_ids")
        self.sources = [list(map(int, row)) for row in ids.tolist()] if ids is not None else [[] for _ in prompts]
        mask = (encoder_inputs or {}).get("attention_mask")
        if mask is not None:
            self.sources = [[t for t, m in zip(src, row) if m] for src, row in zip(self.sources, mask.tolist())]
        return 0

    def lookup(self, row: int, seq: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        hay = self.sources[row] + seq
        for n in range(min(self.ngram, len(seq)), self.min_ngram - 1, -1):
            tail = seq[-n:]
            # search right to left, excluding the tail itself
            for start in range(len(hay) - n - 1, -1, -1):
                if hay[start : start + n] == tail:
                    follow = hay[start + n : start + n + k]
                    if follow:
                        return follow
        return []

    def draft(self, ks, seqs, gen_lens, sampling, generator, stop_below) -> Drafts:
        start = time.perf_counter()
        tokens = [self.lookup(b, seq, k) for b, (seq, k) in enumerate(zip(seqs, ks))]
        return Drafts(tokens, None, 0, time.perf_counter() - start)

    def select(self, keep: list[int], same_encoder: bool = False) -> None:
        self.sources = [self.sources[i] for i in keep]

    def join_row(self, row: int, prompt: list[int], enc: EncoderOutput | None) -> bool:
        self.sources[row] = []  # a decoder-only row's own tokens are its source (``lookup``)
        return True


class ModelDrafter(Drafter):
    def __init__(self, decoder: Decoder, rules: Rules, max_new_tokens: int, share_encoder: bool, pad_id: int,
                 lookup: PromptLookup | None = None) -> None:
        self.decoder, self.rules, self.max_new = decoder, rules, max_new_tokens
        self.share_encoder, self.pad_id, self.lookup = share_encoder, pad_id, lookup
        self.cache = None
        self.enc: EncoderOutput | None = None
        self.pending: list[list[int]] = []
        self._fed: list[int] = []
        self._order: list[int] | None = None  # rows selected since the assistant last ran, not yet applied (select)
        self._moves_encoder = False  # whether one of those selections moved rows to another encoder output
        self._cache_rows = 0  # rows in the assistant's cache (``_reorder``: an order of every row in place is none)
        self._vocab: torch.Tensor | None = None  # the draft head's column -> id map on the device (_vocab_on_device)

    def start(self, prompts, enc, encoder_inputs) -> int:
        calls = 0
        if self.lookup is not None:
            self.lookup.start(prompts, enc, encoder_inputs)
        if self.decoder.reads_encoder:
            if self.share_encoder:
                self.enc = EncoderOutput(enc.hidden.to(self.decoder.dtype), enc.mask)
            else:
                self.enc = self.decoder.encode(**encoder_inputs)
                calls = 1
        # every position a row may reach: its prompt, max_new_tokens, and one past (static caches' capacity)
        self.cache = self.decoder.new_cache(len(prompts), capacity=max(len(p) for p in prompts) + self.max_new + 1)
        self.pending = [list(p) for p in prompts]
        self._order, self._moves_encoder, self._cache_rows = None, False, len(prompts)
        return calls

    def _choose_greedy(self, logits: torch.Tensor, confidence: bool) -> list[tuple[int, float]]:
        """Per row of ``logits`` (B, V') (over the draft head's columns): the argmax token id and, when a
        confidence threshold asks for it, its probability softmax(logits)[argmax] (else 1.0), read to the
        host in one go."""
        col = torch.argmax(logits, dim=-1)
        if confidence:
            p = torch.softmax(logits, dim=-1).gather(-1, col[:, None])[:, 0]
            cols, ps = torch.stack([col.double(), p.double()]).tolist()
        else:
            cols = col.tolist()
            ps = [1.0] * len(cols)
        ids = self.decoder.vocab_ids
        return [((int(c) if ids is None else ids[int(c)]), p) for c, p in zip(cols, ps)]

    def _sample(self, logits: torch.Tensor, sampling: Sampling, generator) -> tuple[int, torch.Tensor, float]:
        """The draft token for one row drawn from its next-token logits (over the draft head's columns), the
        full-vocabulary distribution q it was drawn from and its probability."""
        ids = self.decoder.vocab_ids
        q = to_probs(logits, sampling)
        col = int(torch.multinomial(q, 1, generator=generator))
        p_tok = float(q[col])
        if ids is not None:  # q over the whole vocabulary: zero outside the draft head
            q = torch.zeros(self.decoder.config.vocab_size, dtype=q.dtype, device=q.device).index_copy_(
                0, torch.tensor(ids, device=q.device), q)
            col = ids[col]
        return col, q, p_tok

    def draft(self, ks, seqs, gen_lens, sampling, generator, stop_below) -> Drafts:
        start = time.perf_counter()
        self._reorder()
        if sampling is None and self.lookup is None and not self.rules.processors and self.decoder.device_steps:
            tokens, steps = self._draft_on_device(ks, seqs, gen_lens, stop_below)
            return Drafts(tokens, None, steps, time.perf_counter() - start)
        rows = len(ks)
        tokens: list[list[int]] = [[] for _ in range(rows)]
        probs: list[list[torch.Tensor | None]] = [[] for _ in range(rows)]
        active = [k > 0 for k in ks]
        if self.lookup is not None:
            for b in range(rows):
                hit = self.lookup.lookup(b, seqs[b], ks[b])
                if hit:
                    tokens[b], probs[b], active[b] = hit, [None] * len(hit), False
        model_rows = list(active)
        # First pass feeds each drafting row everything the assistant has not seen; later passes one token.
        feed = [self.pending[b] if active[b] else [] for b in range(rows)]
        steps = 0
        while any(active):
            logits, real = self.decoder.forward(feed, self.cache, self.enc, self.pad_id)
            self.cache.commit(real, [len(f) for f in feed])
            steps += 1
            last = real.sum(dim=1).clamp(min=1) - 1
            nxt = logits[torch.arange(rows, device=logits.device), last][:, None, :]  # (B, 1, V): next-token logits per row
            lens = torch.tensor([[gen_lens[b] + len(tokens[b]) if active[b] else PAD_GEN_LEN] for b in range(rows)],
                                device="cpu")  # the rules read it on the host
            prefixes = [[seqs[b] + tokens[b]] for b in range(rows)] if self.rules.needs_prefix else None
            apply_rules(self.rules, nxt, lens, self.max_new, prefixes, self.decoder.vocab_ids)
            if sampling is None:  # every row's token (and its probability) in one read
                chosen = self._choose_greedy(nxt[:, 0], stop_below is not None)
            for b in range(rows):
                if not active[b]:
                    feed[b] = []
                    continue
                if sampling is None:
                    (tok, p_tok), q = chosen[b], None
                else:
                    tok, q, p_tok = self._sample(nxt[b, 0], sampling, generator)
                tokens[b].append(tok)
                probs[b].append(q)
                stop = len(tokens[b]) >= ks[b] or tok in self.rules.eos or gen_lens[b] + len(tokens[b]) >= self.max_new
                if stop_below is not None and p_tok < stop_below:
                    stop = True
                active[b] = not stop
                feed[b] = [tok] if active[b] else []
        for b in range(rows):
            if model_rows[b]:
                self.pending[b] = []
        # The assistant has fed every model draft of a row but the last (drafting stops after choosing it).
        self._fed = [len(tokens[b]) - 1 if model_rows[b] else 0 for b in range(rows)]
        return Drafts(tokens, probs if sampling is not None else None, steps, time.perf_counter() - start)

    def _vocab_on_device(self) -> torch.Tensor:
        """The draft head's column -> token id map on the device (built once)."""
        if self._vocab is None:
            self._vocab = from_host(list(self.decoder.vocab_ids), torch.long, self.decoder.device)
        return self._vocab

    def _draft_on_device(self, ks: list[int], seqs: list[list[int]], gen_lens: list[int],
                         stop_below: float | None) -> tuple[list[list[int]], int]:
        """Greedy drafting whose steps never wait on the host (``draft_loop.draft_on_device``): each row's
        lookahead bounded by the room before max_new_tokens. Returns the drafts per row and the forward
        passes run; the drafts equal the host loop's (``draft``)."""
        room = [max(0, min(k, self.max_new - g)) for k, g in zip(ks, gen_lens)]  # drafts row b may take
        vocab = None if self.decoder.vocab_ids is None else self._vocab_on_device()
        feeds = [self.pending[b] if room[b] else [] for b in range(len(ks))]
        ts = self.rules.timestamps
        stamps = [ts.state(seq) for seq in seqs] if ts is not None else None  # (timestamps.py)
        tokens, steps = draft_on_device(self.decoder, self.cache, self.enc, self.rules, self.max_new, feeds, room,
                                        gen_lens, self.pad_id, stop_below, vocab, stamps)
        for b in range(len(ks)):
            if room[b]:
                self.pending[b] = []
        # The assistant has fed every draft of a row but the last (drafting stops after choosing it).
        self._fed = [max(len(t) - 1, 0) for t in tokens]
        self.cache.add_counts(self._fed)
        return tokens, steps

    def update(self, drafted, accepted, emitted) -> None:
        """Rejected drafts leave the assistant's cache (holes in a ragged one; a static one steps its
        positions back); tokens emitted but not yet fed to it become the next round's first input."""
        if self._fed:  # it drafted this round: its cache rows must follow the rows' order before stepping back
            self._reorder()
        rejected = []
        for b, (a, e) in enumerate(zip(accepted, emitted)):
            fed = self._fed[b] if self._fed else 0  # no draft this round: nothing was fed
            kept = min(a, fed)
            rejected.append(fed - kept)
            self.pending[b] = self.pending[b] + e[kept:]
        self.cache.rollback_rows(rejected)
        self._fed = []
        self.cache.maybe_compact()

    def join_row(self, row: int, prompt: list[int], enc: EncoderOutput | None) -> bool:
        """``Drafter.join_row`` on a ragged cache (a CPU's): the row's slots become holes and its positions
        restart from 0, its cross-attention keys and values come from ``enc`` alone (a decoder that reads an
        encoder must offer ``join_cross``), and the prompt is fed at its next draft."""
        reads = self.decoder.reads_encoder
        if not isinstance(self.cache, RaggedCache) or (reads and not hasattr(self.decoder, "join_cross")):
            return False
        if self.lookup is not None and not self.lookup.join_row(row, prompt, enc):
            return False
        self._reorder()
        self.cache.reset_row(row)
        if reads and self.enc is not None:
            self.enc.hidden[row : row + 1].copy_(enc.hidden)
            if not self.cache.needs_cross():
                self.decoder.join_cross(self.cache, row, enc)
        self.pending[row] = list(prompt)
        if self._fed:
            self._fed[row] = 0
        return True

    def finish(self) -> None:
        if self.cache is not None:
            self.cache.release()

    def select(self, keep: list[int], same_encoder: bool = False) -> None:
        """Keep rows ``keep`` (``Drafter.select``). The rows' tokens to feed follow at once; the assistant's
        cache and encoder output follow when it next drafts (``_reorder``), the selections since composed into
        one copy: beam search relabels its beams every round, and while the policy drafted nothing, copying
        them every round made assisted beam search 1.7x slower than plain (docs/transcription.md). With
        ``same_encoder`` the cross-attention keys and values and the encoder output need no copy at all."""
        self._order = keep if self._order is None else [self._order[i] for i in keep]
        self._moves_encoder = self._moves_encoder or not same_encoder
        self.pending = [self.pending[i] for i in keep]
        self._fed = [self._fed[i] for i in keep] if self._fed else []
        if self.lookup is not None:
            self.lookup.select(keep)

    def _reorder(self) -> None:
        """Apply the rows selected since the assistant last ran: row i of its cache takes the old row
        ``order[i]`` (nothing is copied when that is every row in place). The cross-attention keys and values
        and the encoder output move too unless every selection kept each row's encoder output; where some did,
        moving them by the composed order is still right, as those rows' encoder outputs are equal."""
        order, moves, self._order, self._moves_encoder = self._order, self._moves_encoder, None, False
        if order is None or order == list(range(self._cache_rows)):
            return
        rows = from_host(order, torch.long, self.decoder.device)
        self.cache.select(rows, order, cross=moves)
        if moves and self.enc is not None:
            self.enc = self.enc.select(rows)
        self._cache_rows = len(order)


# A factory makes a fresh drafter for each request (rules and max_new_tokens are per request), so the
# shared engine object holds no per-request state.
DrafterFactory = Callable[[Rules, int], Drafter]


def model_drafter(decoder: Decoder, share_encoder: bool, pad_id: int, lookup_ngram: int | None = None,
                  lookup_min_ngram: int = 1) -> DrafterFactory:
    """Draft with an assistant model (optionally trying prompt lookup first, row by row)."""

    def make(rules: Rules, max_new_tokens: int) -> Drafter:
        lookup = PromptLookup(lookup_ngram, lookup_min_ngram) if lookup_ngram else None
        return ModelDrafter(decoder, rules, max_new_tokens, share_encoder, pad_id, lookup)

    return make


def prompt_lookup(ngram: int = 3, min_ngram: int = 1) -> DrafterFactory:
    """Draft by prompt lookup alone (``PromptLookup``)."""

    def make(rules: Rules, max_new_tokens: int) -> Drafter:
        return PromptLookup(ngram, min_ngram)

    return make
