"""Lookahead policies: how many tokens to draft next round. One policy object per request (created by
``make_policy`` for each call). The adaptive policy also reads and updates a ``CostMemory`` owned by the
engine: measured costs (seconds per draft step, per verify pass of each length) and the acceptance rate,
so a request starts from what earlier ones measured instead of probing from nothing. Only measurements are
carried over, never tokens: outputs do not depend on it."""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("constant", "heuristic", "confidence", "adaptive", "random")


@dataclass(frozen=True)
class PolicyOptions:
    name: str = "adaptive"  # one of POLICIES
    lookahead: int = 1  # constant: always; heuristic/adaptive: the first round's lookahead (a cheap probe)
    max_lookahead: int = 8  # upper bound for heuristic, confidence and adaptive
    confidence: float = 0.4  # confidence: stop drafting a row when the drafted token's probability is below this
    seed: int = 0  # random: the seed of the schedule


class Policy:
    stop_below: float | None = None  # drafting of a row stops after a token with probability below this

    def next_k(self, rows: int) -> list[int]:
        raise NotImplementedError

    def observe(self, drafted: list[int], accepted: list[int], draft_s: float, verify_s: float, chunk: int) -> None:
        pass

    def select(self, keep: list[int]) -> None:
        pass

    def catch_up(self) -> None:
        """The assistant was started afresh on the rows (a continuous batch's join): its next drafting round
        first feeds it every row's tokens so far."""


class Constant(Policy):
    def __init__(self, k: int) -> None:
        self.k = k

    def next_k(self, rows: int) -> list[int]:
        return [self.k] * rows


class Heuristic(Policy):
    """transformers' heuristic schedule, per row: +2 after a round where every draft was accepted, else -1."""

    def __init__(self, k: int, k_max: int) -> None:
        self.start, self.k_max, self.ks = k, k_max, None

    def next_k(self, rows: int) -> list[int]:
        if self.ks is None:
            self.ks = [self.start] * rows
        return list(self.ks)

    def observe(self, drafted, accepted, draft_s, verify_s, chunk) -> None:
        if self.ks is None:  # a round before any lookahead was asked for (beam search's first: it cannot draft)
            return
        self.ks = [min(self.k_max, k + 2) if a == d and d > 0 else max(1, k - 1)
                   for k, d, a in zip(self.ks, drafted, accepted)]

    def select(self, keep: list[int]) -> None:
        if self.ks is not None:
            self.ks = [self.ks[i] for i in keep]


class Confidence(Policy):
    """Draft up to ``k_max`` tokens, stopping a row once a drafted token's probability is below a threshold."""

    def __init__(self, k_max: int, threshold: float) -> None:
        self.k_max, self.stop_below = k_max, threshold

    def next_k(self, rows: int) -> list[int]:
        return [self.k_max] * rows


class Random(Policy):
    """A seeded random lookahead per row and round, 0 to ``k_max`` (0: a plain step): a schedule no real
    policy would choose, to check that outputs do not depend on the schedule."""

    def __init__(self, k_max: int, seed: int) -> None:
        import random

        self.k_max, self.rng = k_max, random.Random(seed)

    def next_k(self, rows: int) -> list[int]:
        return [self.rng.randint(0, self.k_max) for _ in range(rows)]


@dataclass
class Costs:
    """What one batch size has measured: EMA of seconds per draft step and per verify pass of n tokens,
    and acceptance counts (decayed, so they follow the recent requests)."""

    draft_step_s: float | None = None
    verify_s: dict[int, float] = field(default_factory=dict)
    # Beta(3, 1.5) prior on the acceptance rate (mean 0.67, worth 4.5 drafts: what a pair is made for), so
    # that two rejected drafts at the start do not switch drafting off before its costs are known
    accepted: float = 3.0
    rejected: float = 1.5
    plain_left: int = 0  # rounds of plain decoding left before the next probe (counted across requests)
    plain_wait: int = 16  # the wait after the next failed probe
    # what the adaptive policy decided, counted across requests (what a run's summary reports)
    rounds: int = 0  # rounds it chose a lookahead for
    plain_rounds: int = 0  # of them, rounds it decoded without drafts (waiting, or measuring a plain step)
    stopped_at: int | None = None  # the round where drafts first did not pay and it stopped drafting

    @property
    def drafting_off(self) -> bool:
        """Whether drafting stopped and has not paid since: the policy waits, or probes, plainly."""
        return self.stopped_at is not None and (self.plain_left > 0 or self.plain_wait > 16)


class CostMemory:
    """Measured costs per batch-size bucket, shared by the requests one engine serves (updates are single
    float assignments; concurrent requests at worst overwrite each other's latest measurement)."""

    def __init__(self) -> None:
        self.buckets: dict[int, Costs] = {}

    def for_rows(self, rows: int) -> Costs:
        bucket = 1 << max(0, rows - 1).bit_length()  # 1, 2, 4, 8, ...
        return self.buckets.setdefault(bucket, Costs())


class Adaptive(Policy):
    """Pick the lookahead from measured costs.

    With acceptance rate a (probability that a draft token is accepted given the previous one was),
    a round drafting k tokens yields on average E(k) = (1 - a^(k+1)) / (1 - a) tokens, and costs
    k * c_draft + c_verify(k + 1) seconds, c_verify(n) being the measured cost of a verify pass over n
    tokens (CPU matrix kernels make it a step function of n, so it is measured per n, not fitted; an n not
    yet measured is estimated from the nearest measured one as (0.94 + 0.06 n), optimistically, so it gets
    tried and measured). Plain decoding yields 1 token per c_verify(1). We draft the k that maximises
    E(k) / cost(k); if even that is not faster than plain decoding (gain below 1) we decode plainly for a
    while (doubling the wait after each failed probe, up to 64 rounds) and then probe again, with the
    shortest lookahead whose verify pass is not timed yet (else 1). The wait is counted in the shared
    memory, across requests: a run of short requests (a folder of short clips) still probes, instead of
    staying plain after one unlucky start.
    The first round of a request (prompt and cross-attention set-up) is not timed. Nor is the drafting of a
    round after one that drafted nothing: the assistant is fed lazily, so such a round first feeds it every
    token emitted since it last ran (a probe after 16 to 64 plain rounds; and in beam search, whose first
    round cannot draft, its prompt and cross-attention set-up), which is not what a draft step costs while it
    drafts every round; the next round drafts as many tokens again, and that one is timed. (Timed, a probe
    of speech-real's beam search measured 177 ms a draft step against 67 ms a verify pass, and drafting
    never came back.)
    """

    def __init__(self, k: int, k_max: int, memory: CostMemory | None = None) -> None:
        self.k, self.k_max = k, k_max
        self.memory = memory or CostMemory()
        self.costs: Costs | None = None
        self.rounds = 0
        self.chosen = 0  # the lookahead of the round being decoded
        self.idle = True  # whether the last round drafted nothing (the assistant has tokens to catch up on)
        self.again: int | None = None  # a lookahead to draft once more, timed (its last round caught up)

    def _verify_cost(self, n: int) -> float:
        table = self.costs.verify_s
        if n in table:
            return table[n]
        near = min(table, key=lambda m: (abs(m - n), m))
        return table[near] * (0.94 + 0.06 * n) / (0.94 + 0.06 * near)

    def best_k(self) -> tuple[int, float]:
        """The lookahead with the highest predicted speed, and its predicted gain over plain decoding."""
        c = self.costs
        if c is None or c.draft_step_s is None or not c.verify_s:
            return self.k, float("inf")
        a = min(c.accepted / (c.accepted + c.rejected), 0.999)
        plain_rate = 1.0 / self._verify_cost(1)
        best, best_rate = 0, plain_rate
        for k in range(1, self.k_max + 1):
            tokens = (1 - a ** (k + 1)) / (1 - a)
            rate = tokens / (k * c.draft_step_s + self._verify_cost(k + 1))
            if rate > best_rate:
                best, best_rate = k, rate
        return best, best_rate / plain_rate

    def probe_k(self) -> int:
        """The lookahead to probe with: the shortest whose verify pass has not been timed yet (its cost is
        only extrapolated, and CPU kernels make longer passes sometimes cheaper than shorter ones), else 1."""
        untimed = [n - 1 for n in range(2, self.k_max + 2) if n not in self.costs.verify_s]
        return min(untimed, default=1)

    def next_k(self, rows: int) -> list[int]:
        c = self.costs = self.memory.for_rows(rows)
        c.rounds += 1
        k = self.chosen = self._choose()
        c.plain_rounds += k == 0
        return [k] * rows

    def _choose(self) -> int:
        """This round's lookahead (class docstring), the costs' waits updated."""
        c = self.costs
        if self.rounds >= 1 and (1 not in c.verify_s or self.rounds % 64 == 0):
            return 0  # measure a plain step (now and then): the cost every lookahead is compared with
        if self.again is not None:  # the last round's drafts caught the assistant up: these are timed
            k, self.again = self.again, None
            return k
        if c.plain_left > 0:
            c.plain_left -= 1
            return self.probe_k() if c.plain_left == 0 else 0
        k, gain = self.best_k()
        if k == 0 or gain < 1.0:
            c.plain_left = c.plain_wait
            c.plain_wait = min(64, c.plain_wait * 2)
            c.stopped_at = c.rounds if c.stopped_at is None else c.stopped_at
            return 0
        c.plain_wait = 16  # drafting pays again: the next failed probe waits the shortest time
        return k

    def catch_up(self) -> None:
        self.idle = True  # that round is not timed (class docstring)

    def observe(self, drafted, accepted, draft_s, verify_s, chunk) -> None:
        c = self.costs
        self.rounds += 1
        steps = max(drafted) if drafted else 0
        catching_up, self.idle = self.idle, steps == 0
        if steps > 0:
            decay = 0.995  # older requests' acceptance fades (a window of a few hundred rounds)
            c.accepted, c.rejected = c.accepted * decay, c.rejected * decay
            for d, a in zip(drafted, accepted):
                c.accepted += a
                c.rejected += 1 if a < d else 0
        if self.rounds == 1:
            return  # the first round also fed the prompt and set up cross-attention: not a typical cost
        if steps > 0 and catching_up:
            self.again = self.chosen  # (class docstring)
        elif steps > 0:
            per_step = draft_s / steps
            c.draft_step_s = per_step if c.draft_step_s is None else 0.8 * c.draft_step_s + 0.2 * per_step
        old = c.verify_s.get(chunk)
        c.verify_s[chunk] = verify_s if old is None else 0.8 * old + 0.2 * verify_s


def parse_policy(text: str) -> PolicyOptions:
    """``NAME[:N]`` as given on the command line: ``adaptive``, ``constant:3`` (N: the lookahead),
    ``heuristic:2`` (N: the first lookahead), ``confidence`` or ``random:7`` (N: the seed). Raises ValueError
    with a sentence for an unknown name or a bad N."""
    name, _, arg = text.strip().partition(":")
    if name not in POLICIES:
        raise ValueError(f"unknown lookahead policy {name!r}; expected one of {', '.join(POLICIES)}")
    if not arg:
        return PolicyOptions(name)
    if not arg.isdigit() or (name != "random" and not 1 <= int(arg) <= PolicyOptions.max_lookahead):
        raise ValueError(f"lookahead {text!r}: N must be a whole number"
                         + ("" if name == "random" else f" from 1 to {PolicyOptions.max_lookahead}"))
    if name == "random":
        return PolicyOptions(name, seed=int(arg))
    return PolicyOptions(name, lookahead=int(arg))


def make_policy(options: PolicyOptions, memory: CostMemory | None = None) -> Policy:
    if options.name == "constant":
        return Constant(options.lookahead)
    if options.name == "heuristic":
        return Heuristic(options.lookahead, options.max_lookahead)
    if options.name == "confidence":
        return Confidence(options.max_lookahead, options.confidence)
    if options.name == "adaptive":
        return Adaptive(options.lookahead, options.max_lookahead, memory)
    if options.name == "random":
        return Random(options.max_lookahead, options.seed)
    raise ValueError(f"unknown lookahead policy {options.name!r}; expected one of {', '.join(POLICIES)}")
