"""Host-built tensors and row copies of logits: the engine's per-round index work.

``from_host`` builds a tensor from Python lists on the host and copies it to the device without waiting:
on CUDA a blocking host-to-device copy (``torch.tensor(..., device="cuda")``) synchronises the stream
like a read does, so every index a round builds goes through it.

Row copies between (rows, positions, vocabulary) tensors, two ways with the same values (they are copies): a slice copy per row, cheapest on a CPU, and one
``index_select``/``index_copy_`` of whole rows, one kernel launch on an accelerator whatever the rows
(the index is built on the host and copied once). ``indexed(device)`` picks between them.
"""

from __future__ import annotations

import torch


def from_host(data, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``data`` (nested lists of numbers) as a tensor on ``device``: built on the host, then one non-blocking
    copy (no stream synchronisation; safe from pageable memory, which CUDA stages before returning)."""
    return to_device(torch.tensor(data, dtype=dtype, device="cpu"), device)


def per_vocabulary(memo: dict, limit: int, vocab, key: tuple, device: torch.device, make) -> torch.Tensor:
    """``make()``, a tensor on ``device`` built from ``vocab`` (a drafter's sorted ids, or None), made once per
    vocabulary object, ``key`` and device and then reused (never written): ``memo`` maps (id(vocab), key,
    device) to (vocab, tensor). The entry keeps ``vocab`` alive, so its id names it while the entry lives;
    past ``limit`` entries the memo starts again (a graph that read an entry holds the tensor itself)."""
    full = (id(vocab), key, str(device))
    hit = memo.get(full)
    if hit is None or hit[0] is not vocab:
        if len(memo) >= limit:
            memo.clear()
        hit = memo[full] = (vocab, make())
    return hit[1]


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on ``device`` without a stream synchronisation (itself on a CPU)."""
    return tensor.to(device, non_blocking=True)


class StillRunning:
    """Whether any row of a device-side loop still runs, read without waiting for the device where a read
    costs a synchronisation: on CUDA the flag goes to pinned host memory behind an event and is read once
    the event has completed (a step or so late: a loop may run a step more than needed, never less); on a
    CPU it is read at once (no device to wait for); elsewhere it is not read (the loop runs to its bound).
    The flag is a (1,) bool tensor on the device: whether any row is still alive."""

    def __init__(self, device: torch.device) -> None:
        self.mode = "event" if device.type == "cuda" else ("now" if not indexed(device) else "never")
        if self.mode == "event":
            self.flag = torch.ones(1, dtype=torch.bool, device="cpu").pin_memory()
            self.event = torch.cuda.Event()
            self.posted = False

    def post(self, running: torch.Tensor) -> None:
        """Start reading ``running`` (1,) (CUDA: a non-blocking copy, then the event)."""
        if self.mode == "event":
            self.flag.copy_(running, non_blocking=True)
            self.event.record()
            self.posted = True

    def stopped(self, running: torch.Tensor) -> bool:
        """True when no row runs any more (as far as is known without waiting); ``running`` as posted."""
        if self.mode == "now":
            return not bool(running)
        if self.mode == "event" and self.posted and self.event.query():
            return not bool(self.flag[0])
        return False


def indexed(device: torch.device) -> bool:
    """Whether row copies on ``device`` go through one indexed copy (accelerators) or a copy per row (CPU)."""
    return device.type != "cpu"


def gather_rows(logits: torch.Tensor, starts: list[int], counts: list[int], width: int,
                by_index: bool | None = None) -> torch.Tensor:
    """(B, width, V) from ``logits`` (B, n, V): row b holds logits[b, starts[b] : starts[b] + counts[b]] from
    column 0 and -inf after. ``by_index``: force one way (None: ``indexed``). Where every row takes the same
    ``width`` columns (a verify pass at batch 1, most rounds), a view of ``logits``: no copy."""
    batch, n, vocab = logits.shape
    device = logits.device
    if len(set(starts)) == 1 and all(c == width for c in counts):
        return logits[:, starts[0] : starts[0] + width]
    if not (indexed(device) if by_index is None else by_index):
        sel = torch.full((batch, width, vocab), float("-inf"), device=device)
        for b, (s, c) in enumerate(zip(starts, counts)):
            if c:
                sel[b, :c] = logits[b, s : s + c]
        return sel
    source = [b * n + s + min(j, max(c - 1, 0)) for b, (s, c) in enumerate(zip(starts, counts)) for j in range(width)]
    empty = [b * width + j for b, c in enumerate(counts) for j in range(c, width)]
    flat = logits.reshape(batch * n, vocab).index_select(0, from_host(source, torch.long, device))
    if empty:
        flat.index_fill_(0, from_host(empty, torch.long, device), float("-inf"))
    return flat.view(batch, width, vocab)


def scatter_rows(target: torch.Tensor, source: torch.Tensor, where: list[tuple[int, int, int]],
                 by_index: bool | None = None) -> None:
    """target[b, j] = source[b, c] for each (b, c, j) of ``where``, in place; target (B, n, V), source (B, w, V).
    ``by_index``: force one way (None: ``indexed``)."""
    if not where:
        return
    if not (indexed(target.device) if by_index is None else by_index):
        for b, c, j in where:
            target[b, j] = source[b, c]
        return
    batch, n, vocab = target.shape
    w = source.shape[1]
    src = from_host([b * w + c for b, c, _ in where], torch.long, target.device)
    dst = from_host([b * n + j for b, _, j in where], torch.long, target.device)
    target.view(batch * n, vocab).index_copy_(0, dst, source.reshape(batch * w, vocab).index_select(0, src))


def aligned_rows(logits: torch.Tensor, multiple: int = 8) -> torch.Tensor:
    """``logits`` (..., V) for a reduction over the vocabulary (softmax, logsumexp, max) whose bits must not
    depend on where a row sits: on CUDA, V padded with -inf columns to a multiple of ``multiple`` in a new
    tensor, so every row starts at the same alignment. CUDA's softmax kernels load a row in 16-byte vectors
    from its first aligned element and treat the unaligned head apart, so with V = 51,865 the same row at
    index j of a (n, V) tensor and at index j' of another sums in another order (a plain step's width-1
    logits against a verify pass's width-(k + 1)); -inf columns add exact zeros (exp(-inf) = 0) and are
    never the maximum. On a CPU (vector loads anywhere, the order by index) ``logits`` as it is. A reduction over several rows at
    once may still depend on their number (``rowwise_logsumexp``); softmax reduces each row in a block of its own."""
    if logits.device.type != "cuda":
        return logits
    pad = -logits.shape[-1] % multiple
    if pad == 0:
        return logits.contiguous()
    return torch.nn.functional.pad(logits, (0, pad), value=float("-inf"))


def rowwise_logsumexp(x: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last axis of ``x`` (N, C), each row's bits independent of N: on CUDA one reduction
    per row (a sum over several rows takes its thread layout from the number of rows, ATen's
    ``ReduceConfig``, and with it its order), elsewhere one call."""
    if x.device.type != "cuda":
        return x.logsumexp(dim=-1)
    return torch.stack([row.logsumexp(dim=-1) for row in x]) if len(x) else x.new_zeros(0)
