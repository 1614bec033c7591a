"""Lookahead policies: how many tokens to draft next round. One policy object per request (created by
``make_policy`` for each call), so nothing is carried from one request to the next."""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("constant", "heuristic", "confidence", "adaptive")


@dataclass(frozen=True)
class PolicyOptions:
    name: str = "adaptive"  # one of POLICIES
    lookahead: int = 1  # constant: always; heuristic/adaptive: the first round's lookahead (a cheap probe)
    max_lookahead: int = 8  # upper bound for heuristic, confidence and adaptive
    confidence: float = 0.4  # confidence: stop drafting a row when the drafted token's probability is below this


class Policy:
    stop_below: float | None = None  # drafting of a row stops after a token with probability below this

    def next_k(self, rows: int) -> list[int]:
        raise NotImplementedError

    def observe(self, drafted: list[int], accepted: list[int], draft_s: float, verify_s: float, chunk: int) -> None:
        pass

    def select(self, keep: list[int]) -> None:
        pass


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


class Adaptive(Policy):
    """Pick the lookahead from what this request has measured so far.

    With acceptance rate a (probability that a draft token is accepted given the previous one was),
    a round drafting k tokens yields on average E(k) = (1 - a^(k+1)) / (1 - a) tokens, and costs
    k * c_draft + c_verify(k + 1) seconds, where c_verify(n) = v0 + v1 * n is fitted to the measured
    verify passes. Plain decoding yields 1 token per c_verify(1). We draft the k that maximises
    E(k) / cost(k); if even that is not faster than plain decoding (gain below 1) we decode plainly for a
    while (doubling the wait after each failed probe) and then probe again with a short draft.
    """

    def __init__(self, k: int, k_max: int) -> None:
        self.k, self.k_max = k, k_max
        self.accepted, self.rejected = 1.0, 1.0  # Beta(1, 1) prior on the acceptance rate
        self.draft_step_s: float | None = None
        self.verify: list[tuple[int, float]] = []  # (chunk length, seconds) of recent verify passes
        self.plain_left, self.plain_wait = 0, 16

    def _acceptance(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def _verify_cost(self, n: int) -> float:
        pts = self.verify[-32:]
        ns = {p[0] for p in pts}
        if len(ns) >= 2:
            mean_n = sum(p[0] for p in pts) / len(pts)
            mean_t = sum(p[1] for p in pts) / len(pts)
            var = sum((p[0] - mean_n) ** 2 for p in pts)
            slope = max(0.0, sum((p[0] - mean_n) * (p[1] - mean_t) for p in pts) / var)
            return max(1e-6, mean_t + slope * (n - mean_n))
        # One chunk length seen so far: assume a verify of n tokens costs (0.94 + 0.06 n) of one token.
        n0, t0 = pts[-1]
        return t0 * (0.94 + 0.06 * n) / (0.94 + 0.06 * n0)

    def best_k(self) -> tuple[int, float]:
        """The lookahead with the highest predicted speed, and its predicted gain over plain decoding."""
        if self.draft_step_s is None or not self.verify:
            return self.k, float("inf")
        a = min(self._acceptance(), 0.999)
        plain_rate = 1.0 / self._verify_cost(1)
        best, best_rate = 0, plain_rate
        for k in range(1, self.k_max + 1):
            tokens = (1 - a ** (k + 1)) / (1 - a)
            rate = tokens / (k * self.draft_step_s + self._verify_cost(k + 1))
            if rate > best_rate:
                best, best_rate = k, rate
        return best, best_rate / plain_rate

    def next_k(self, rows: int) -> list[int]:
        if self.plain_left > 0:
            self.plain_left -= 1
            if self.plain_left == 0:
                return [1] * rows  # probe
            return [0] * rows
        k, gain = self.best_k()
        if k == 0 or gain < 1.0:
            self.plain_left = self.plain_wait
            self.plain_wait = min(64, self.plain_wait * 2)
            return [0] * rows
        return [k] * rows

    def observe(self, drafted, accepted, draft_s, verify_s, chunk) -> None:
        steps = max(drafted) if drafted else 0
        if steps > 0:
            per_step = draft_s / steps
            self.draft_step_s = per_step if self.draft_step_s is None else 0.7 * self.draft_step_s + 0.3 * per_step
            for d, a in zip(drafted, accepted):
                self.accepted += a
                self.rejected += 1 if a < d else 0
        self.verify.append((chunk, verify_s))


def make_policy(options: PolicyOptions) -> Policy:
    if options.name == "constant":
        return Constant(options.lookahead)
    if options.name == "heuristic":
        return Heuristic(options.lookahead, options.max_lookahead)
    if options.name == "confidence":
        return Confidence(options.max_lookahead, options.confidence)
    if options.name == "adaptive":
        return Adaptive(options.lookahead, options.max_lookahead)
    raise ValueError(f"unknown lookahead policy {options.name!r}; expected one of {', '.join(POLICIES)}")
