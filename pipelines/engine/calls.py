"""What one decode call takes, counts and returns: ``DecodeOptions``, the loop's ``Counters``, ``DecodeStats``,
``DecodeResult``, and ``Start``, the prelude ``AssistedDecoder.start`` gives greedy, sampled and beam decoding
alike (``core.py``, ``beam_loop.py``)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from .decoders import EncoderOutput
from .drafters import Drafter
from .policies import Policy, PolicyOptions
from .rules import Sampling


@dataclass(frozen=True)
class DecodeOptions:
    max_new_tokens: int = 128  # per row, the prompt not counted
    do_sample: bool = False  # False: greedy (lossless); True: speculative sampling (same distribution)
    sampling: Sampling = Sampling()  # temperature / top-k / top-p when do_sample
    seed: int | None = None  # sampling seed (a fresh generator per call)
    policy: PolicyOptions = PolicyOptions()  # how many tokens to draft each round
    use_drafter: bool = True  # False: plain decoding through the same loop
    compare_plain: bool = False  # greedy or beam search: also decode plainly and report, per row, identical outputs
    logits_at: int | None = None  # also return the main model's logits at this prompt index (Whisper's no-speech check)


@dataclass(frozen=True)
class DecodeStats:
    rows: int  # batch size
    new_tokens: int  # tokens emitted, all rows
    rounds: int  # loop iterations
    main_calls: int  # main-model decoder passes (one per round, however many rows it carries)
    draft_calls: int  # drafter forward passes
    encoder_calls: int  # encoder passes, main and assistant together (1 when the encoder output is shared)
    drafted: int  # draft tokens proposed
    accepted: int  # draft tokens accepted
    accepted_hist: dict[int, int] = field(default_factory=dict)  # accepted drafts per (row, round) -> count
    encode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    total_s: float = 0.0
    row_calls: int = 0  # main-model passes summed over rows: the passes each sequence took part in

    @property
    def acceptance(self) -> float:
        """Accepted / proposed draft tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def calls_per_token(self) -> float:
        """Main-model passes per emitted token, per sequence (1.0 for plain decoding at any batch size; lower
        is better): row_calls / new_tokens."""
        return self.row_calls / self.new_tokens if self.new_tokens else 0.0

    @property
    def tokens_per_call(self) -> float:
        """Tokens a sequence gains per main-model pass: accepted drafts + the main model's own token."""
        return self.new_tokens / self.row_calls if self.row_calls else 0.0

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out.update(acceptance=self.acceptance, calls_per_token=self.calls_per_token, tokens_per_call=self.tokens_per_call)
        return out


@dataclass(frozen=True)
class DecodeResult:
    tokens: tuple[tuple[int, ...], ...]  # per row: the emitted tokens (EOS included when emitted)
    stats: DecodeStats
    identical: tuple[bool, ...] | None = None  # with compare_plain: per row, equal to plain greedy decoding
    plain_stats: DecodeStats | None = None  # with compare_plain: the plain run's statistics
    # per row: sum over the emitted tokens of log p(token), p = softmax of the main model's logits after the
    # rules, without temperature (Whisper's sum_logprobs; avg_logprob = sum / len)
    sum_logprobs: tuple[float, ...] = ()
    prompt_logits: torch.Tensor | None = None  # with logits_at: (rows, V) float32, the logits at that prompt index


@dataclass(frozen=True)
class Start:
    """A decode's prelude (``AssistedDecoder.start``): the encoder output, the started drafter (None: plain),
    the lookahead policy, and what it took."""

    t0: float  # perf_counter when the call began
    encoded: EncoderOutput | None  # the main encoder's output, one row an input (inputs, S, D)
    enc: EncoderOutput | None  # the decoder rows' (rows, S, D): ``encoded``, each input's repeated per beam
    drafter: Drafter | None
    policy: Policy
    encoder_calls: int  # encoder passes, main and assistant
    encode_s: float


@dataclass
class Counters:
    """What a decoding loop counts as it goes (``Request``'s, beam search's ``BeamRound``): mutable, one call's."""

    rounds: int = 0
    main_calls: int = 0
    draft_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    hist: Counter = field(default_factory=Counter)  # accepted drafts (beam search: drafted steps) per round -> count
    prompt_logits: torch.Tensor | None = None  # with ``DecodeOptions.logits_at``: (rows, V) float32

    def stats(self, start: Start, rows: int, new_tokens: int, row_calls: int) -> DecodeStats:
        """The call's ``DecodeStats``, its clock read now (``start.t0``: when the call began); other_s is the
        total less encoding, drafting and verifying."""
        total_s = time.perf_counter() - start.t0
        return DecodeStats(
            rows=rows, new_tokens=new_tokens, rounds=self.rounds, main_calls=self.main_calls,
            draft_calls=self.draft_calls, encoder_calls=start.encoder_calls, drafted=self.drafted,
            accepted=self.accepted, accepted_hist=dict(sorted(self.hist.items())), row_calls=row_calls,
            encode_s=start.encode_s, draft_s=self.draft_s, verify_s=self.verify_s,
            other_s=max(0.0, total_s - start.encode_s - self.draft_s - self.verify_s), total_s=total_s)
