"""What a distillation run is asked to do, and what it reports (frozen dataclasses, validated by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import TandemError

TOPK = 8
HELDOUT_SHARD = 0


class DistillError(TandemError, RuntimeError):
    """The distillation cannot go on; the message says why."""


def parse_shards(text: str | None) -> tuple[int, ...]:
    """Comma-separated shard numbers and ranges A-B ("1-3,7" -> (1, 2, 3, 7); DistillError for anything else)."""
    if not text:
        return ()
    shards: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
            raise DistillError(f"--shards {text!r}: shard numbers and ranges A-B, comma-separated")
        shards.update(range(int(low), int(high or low) + 1))
    return tuple(sorted(shards))


def shard_ranges(shards) -> str:
    """Shard numbers as ``parse_shards`` reads them, runs written A-B ([1, 2, 3, 7] -> "1-3,7")."""
    runs: list[list[int]] = []
    for s in sorted(set(shards)):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


@dataclass(frozen=True)
class DistillOptions:
    main: str  # a pair name (its main model), an embedded name, a local folder or a hub id
    out: Path
    layers: int = 2
    init: str = "spread"  # the main's layers the student starts from: spread (first, last, between) or first (early exit)
    data: tuple[str, ...] = ("debian-speech",)  # ASR: debian-speech; text models: text files, one input a line
    clips: int = 4000  # training items to build and label (held-out shard not counted)
    heldout: int = 96
    shard_size: int = 64
    epochs: float = 3.0
    batch_size: int = 16
    lr: float = 3e-4
    kl_weight: float = 0.8
    draft_vocab: int = 16384  # most frequent label tokens kept by the draft head (plus all special tokens); 0: full
    budget_minutes: float | None = None
    resume: bool = False
    seed: int = 20261129
    eval_every: int = 50  # optimizer steps between held-out estimates and checkpoints
    threads: int | None = None
    device: str = "cpu"  # resolved by devices.resolve_device: labelling and training run there
    corpus: Path | None = None  # ASR: the committed corpus folder (None: data/distill/<main model>)
    label_only: bool = False  # grow the committed corpus (Whisper; text models: the training features) and stop
    steps: int | None = None  # optimizer steps per training (None: ``epochs`` over the training items)
    curve: tuple[int, ...] = ()  # corpus sizes of the learning curve: a student trained on the first N clips each
    drafter: str = "student"  # student (a shallow decoder) or medusa (heads on the main decoder's hidden state)
    heads: int = 5  # medusa: draft heads, head k guessing the token k places after the main model's next one
    shards: tuple[int, ...] = ()  # the corpus's training shards to train on (empty: 1 .. ``train_shards``)
    start: str | None = None  # Whisper: an exported assistant folder, or "shipped": the student starts from its layers

    @property
    def train_shards(self) -> int:
        """Training shards for ``clips`` items (shards 1 .. this; shard 0 is held out)."""
        return -(-self.clips // self.shard_size)

    @property
    def training_shards(self) -> list[int]:
        """The shards a training reads: ``shards`` where given, else 1 .. ``train_shards``."""
        return list(self.shards) or list(range(1, self.train_shards + 1))


@dataclass(frozen=True)
class HeldOut:
    agreement: float  # teacher-forced top-1 agreement with the teacher's tokens
    tokens_per_call: float  # simulated at lookahead 5: accepted run + the main model's own token
    coverage: float  # share of teacher tokens inside the draft vocabulary
    per_head: tuple[float, ...] = ()  # Medusa heads: head k's agreement with the teacher's token k places ahead
