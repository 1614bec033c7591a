"""Medusa-style draft heads on a frozen Whisper main model (Cai et al. 2024, "Medusa: Simple LLM Inference
Acceleration Framework with Multiple Decoding Heads", Medusa-1; github.com/FasterDecoding/Medusa): K heads on
the main decoder's last hidden state h (after its final layer norm: the vector its own head reads). Where the
main head reads h at position j to give label j, head k guesses label j + k:
    logits_k(h) = W_k . (h + SiLU(A_k h + b_k)),    k = 1 .. K
W_k (rows x d, rows the draft vocabulary) starting as the main model's head W[rows], A_k and b_k zero, all
trained (as Medusa-1 trains each head's own copy of the LM head): each head starts as the main head. A round:
the main model's verify pass gives its own next token and h at the last accepted position; the K heads draft
the K tokens after it from that one h, at once (no draft model, no draft steps), top-1 each, a chain (no
tree). Loss per head, weighted 0.8^(k-1) as in Medusa:
    CE(teacher token j + k) + w KL(teacher top-8 at j + k || head k at j),
over the draft vocabulary (``student.ce_kl``). A study design: measured in the learning curve beside the
shallow student; the engine has no drafter that reads the main's hidden state, so nothing is exported."""

from __future__ import annotations

import numpy as np

from .options import DistillError, DistillOptions, HeldOut
from .shards import GROUP, Shard
from .student import _batch, calls_for, ce_kl, decoder_macs, draft_columns
from .teacher import Teacher, forced_ids

HEAD_DECAY = 0.8  # the weight of head k's loss is HEAD_DECAY ** (k - 1)


def main_states(model, hidden, prompts: list[list[int]], labels: list[list[int]]) -> list:
    """The main decoder's last hidden state at each label position of each item, teacher-forced: a list of
    (len(labels[b]), d) float tensors (row j: the state whose head output is labels[b][j]), without grad."""
    import torch

    ids = forced_ids(prompts, labels, hidden.device)
    with torch.no_grad():
        h = model.model.decoder(input_ids=ids, encoder_hidden_states=hidden.to(model.dtype), use_cache=False).last_hidden_state
    return [h[b, len(p) - 1 : len(p) - 1 + len(y)].float() for b, (p, y) in enumerate(zip(prompts, labels))]


class MedusaDesign:
    """K Medusa heads as ``training.train`` trains them (``training.Design``). The main model's hidden states
    are computed once per clip and kept (the main model is frozen): len(labels) x d float32 per clip, on the
    main model's device (about 110 kB per clip for Whisper base: 60 MB at 512 clips; a study's scale).
    Trainable: K x (d^2 + d + rows x d)."""

    kind = "medusa"
    init_layers: tuple[int, ...] = ()  # no layers of the main decoder: heads on its output

    def __init__(self, teacher: Teacher, opts: DistillOptions, vocab: list[int]) -> None:
        import torch

        if not teacher.is_whisper:
            raise DistillError("Medusa heads: Whisper main models only")
        self.torch, self.main, self.vocab, self.kl_weight = torch, teacher.model, vocab, opts.kl_weight
        device = next(self.main.parameters()).device
        d = self.main.config.d_model
        self.rows = torch.tensor(vocab, device=device)
        blocks = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(opts.heads))
        for block in blocks:
            torch.nn.init.zeros_(block.weight), torch.nn.init.zeros_(block.bias)
        start = self.main.proj_out.weight.detach()[self.rows].float()  # (rows, d): the main head's rows
        heads = torch.nn.ParameterList(torch.nn.Parameter(start.clone()) for _ in range(opts.heads))
        self.net = torch.nn.ModuleDict({"blocks": blocks, "heads": heads}).float().to(device)
        self.blocks, self.heads = self.net["blocks"], self.net["heads"]
        self.params = list(self.net.parameters())
        self.column = draft_columns(self.rows, self.main.config.vocab_size, device)
        self._states: dict[tuple[int, int], object] = {}
        self._kept: dict[int, Shard] = {}  # the shards whose ids key the states (kept alive: ids stay unique)

    def logits(self, k: int, h):
        """Head k's logits over the draft vocabulary, (n, rows), of hidden states h (n, d)."""
        x = h + self.torch.nn.functional.silu(self.blocks[k - 1](h))
        return x @ self.heads[k - 1].T

    def states(self, shard: Shard, indices: list[int]) -> list:
        """The main model's hidden states of ``shard``'s items ``indices`` (``main_states``), computed once."""
        self._kept[id(shard)] = shard
        todo = [i for i in indices if (id(shard), i) not in self._states]
        device = self.rows.device
        for g in range(0, len(todo), GROUP):
            picks = [(0, i) for i in todo[g : g + GROUP]]
            hidden, _, prompts, labels, _, _ = _batch({0: shard}, picks, device)
            for (_, i), h in zip(picks, main_states(self.main, hidden, prompts, labels)):
                self._states[(id(shard), i)] = h
        return [self._states[(id(shard), i)] for i in indices]

    def loss(self, shards: dict[int, Shard], picks: list[tuple[int, int]]):
        torch = self.torch
        by_pick = {}
        for s in sorted({s for s, _ in picks}):  # the main model's states of a shard's uncached clips in one batch
            indices = [i for t, i in picks if t == s]
            by_pick.update({(s, i): h for i, h in zip(indices, self.states(shards[s], indices))})
        states = [by_pick[p] for p in picks]
        total = self.blocks[0].weight.sum() * 0.0  # a zero in the graph: a batch of one-token labels trains nothing
        for k in range(1, len(self.blocks) + 1):
            xs, targets, t_ids, t_lp = [], [], [], []
            for (s, i), h in zip(picks, states):
                shard, y = shards[s], shards[s].items[i]["labels"]
                if len(y) <= k:
                    continue
                at = shard.offsets[i]
                xs.append(h[: len(y) - k])
                targets += y[k:]
                t_ids.append(shard.topk_ids[at + k : at + len(y)])
                t_lp.append(shard.topk_lp[at + k : at + len(y)])
            if not xs:
                continue
            lp = torch.log_softmax(self.logits(k, torch.cat(xs)), dim=-1)
            loss, n = ce_kl(lp, targets, np.concatenate(t_ids), np.concatenate(t_lp), self.column, self.kl_weight)
            total = total + HEAD_DECAY ** (k - 1) * loss / max(n, 1)
        return total

    def evaluate(self, shard: Shard) -> HeldOut:
        """Teacher-forced agreement of each head, and tokens per main call: a call starting at label t (t > 0:
        the first call is the prompt's, with no drafts) accepts head k's guess from the state at t - 1 while
        it equals label t - 1 + k, k = 1 .. K in order, then adds the main model's own token."""
        torch = self.torch
        K = len(self.blocks)
        agree, total = [0] * K, [0] * K
        covered = tokens = calls = 0
        with torch.inference_mode():
            for i, h in enumerate(self.states(shard, list(range(len(shard.items))))):
                y = shard.items[i]["labels"]
                target = torch.tensor(y, device=h.device)
                hits = []
                for k in range(1, K + 1):
                    pred = self.rows[self.logits(k, h[: max(len(y) - k, 0)]).argmax(-1)]
                    hit = (pred == target[k:]).tolist()
                    agree[k - 1] += sum(hit)
                    total[k - 1] += len(hit)
                    hits.append(hit)
                covered += int(torch.isin(target, self.rows).sum())
                tokens += len(y)
                calls += calls_for(len(y), lambda t, r: t > 0 and hits[r][t - 1], K)
        per_head = tuple(round(a / max(n, 1), 4) for a, n in zip(agree, total))
        return HeldOut(per_head[0] if per_head else 0.0, tokens / max(calls, 1), covered / max(tokens, 1), per_head)

    def state(self) -> dict:
        return {k: v.detach().clone() for k, v in self.net.state_dict().items()}

    def load(self, state: dict) -> None:
        self.net.load_state_dict(state)

    def mode(self, training: bool) -> None:
        self.net.train(training)

    def cost(self, config) -> float:
        """Multiply-adds per drafted token relative to a main step: one head's block (d^2) and its rows x d
        logits (``student.decoder_macs`` for the main step)."""
        d = config.d_model
        return round((d * d + len(self.vocab) * d) / decoder_macs(config, config.decoder_layers, config.vocab_size), 3)
