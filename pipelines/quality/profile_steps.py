"""The measurements behind ``profile_text`` (issue 55): what one plain decode step of a text model costs and
where its time goes, for Tandem's main decoders (torch: bfloat16, int8, int4; llama.cpp: q4_k_m) and llama.cpp's
own decoding of the same GGUF file.

- ``decoder_steps`` / ``llamacpp_steps``: seconds of the first call on a prompt (the prompt pass and its last
  token) and of each later greedy one-token step;
- ``torch_step_profile``: a torch decoder's steps under ``torch.profiler``, by part (``PARTS``: regions around
  the decoder layers' linear modules, ``attend`` and the head; the rest is the steps' total less them) and by
  aten op (self CPU time);
- ``torch_weight_bytes``: the bytes of weights a step reads (all but the embedding table, of which a step
  gathers one row).

Times are ms a step; a share is of the step's total."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

PARTS = ("linear", "head", "attention", "rest")
# "cpu": the process's CPU time (every thread's), steadier than the wall clock on a shared machine at 1 thread
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
HEAD_NAME = "lm_head"  # the output projection's name in the IR and in the torch model
EMBEDDING_NAME = "embed_tokens"  # the embedding table's (a step reads one row of it: not counted)


@dataclass(frozen=True)
class Share:
    """One group of a step's time: ``ms`` a step (summed over its nodes or ops), ``share`` of the step's total."""

    name: str
    ms: float
    share: float


@dataclass(frozen=True)
class StepCost:
    """One system on the prompt: ``first_ms`` the prompt pass with the first token, ``step_ms`` the median
    plain step after it (``steps`` of them), ``weight_mb`` the weights a step reads (MB, embeddings left out;
    None where not measured), ``notes`` what else was measured (OpenVINO's own metrics, properties)."""

    system: str
    first_ms: float
    step_ms: float
    steps: int
    weight_mb: float | None = None
    notes: str = ""

    @classmethod
    def timed(cls, system: str, first_s: float, times: list[float], weight_mb: float | None, notes: str) -> StepCost:
        """From ``decoder_steps``' seconds."""
        return cls(system, round(first_s * 1e3, 1), round(statistics.median(times) * 1e3, 2), len(times), weight_mb,
                   notes)


def shares(times: Iterable[tuple[str, float]], steps: int = 1) -> list[Share]:
    """``(name, ms)`` pairs summed by name, divided by ``steps`` (ms a step), largest first, each with its share
    of the total (0 when the total is 0)."""
    sums: dict[str, float] = defaultdict(float)
    for name, ms in times:
        sums[name] += ms
    total = sum(sums.values())
    return [Share(n, round(ms / steps, 3), round(ms / total, 4) if total else 0.0)
            for n, ms in sorted(sums.items(), key=lambda kv: -kv[1])]


def torch_weight_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of ``model``'s parameters and buffers by ``"<part> <dtype>"`` (part: ``head`` or ``layers``), the
    embedding table left out, and each tensor once (a tied head counts as the head): what a decode step reads.
    A quantized layer's dense-path copy of its scales (``dense_sz``, read by prompt passes only) is left out."""
    out: dict[str, int] = defaultdict(int)
    seen: set[int] = set()
    head = getattr(model, "lm_head", None)
    tensors = [("lm_head.weight", head.weight)] if head is not None else []
    tensors += list(model.named_parameters()) + list(model.named_buffers())
    for name, t in tensors:
        if t is None or t.data_ptr() in seen or "dense_sz" in name or name.endswith("inv_freq"):
            continue
        seen.add(t.data_ptr())
        if EMBEDDING_NAME in name:
            continue
        part = "head" if name.startswith(HEAD_NAME) else "layers"
        out[f"{part} {str(t.dtype).removeprefix('torch.')}"] += t.numel() * t.element_size()
    return dict(out)


def megabytes(parts: dict[str, int]) -> float:
    """The total of ``parts`` (bytes) in MB."""
    return round(sum(parts.values()) / 1e6, 1)


def decoder_steps(decoder, prompt: list[int], steps: int, pad_id: int, warm: int = 2, around=nullcontext,
                  clock=time.perf_counter) -> tuple[float, list[float]]:
    """Seconds of a Tandem main decoder's first call on ``prompt`` (the prompt pass, then its last token's pass)
    and of each of ``steps`` greedy plain steps after ``warm`` untimed ones (a step: one token, padded to the
    decoder's width, through ``forward``; the argmax fed back). ``around()``: a context entered around the
    timed steps alone (a profiler); ``clock``: seconds by ``CLOCKS``' wall or CPU clock."""
    cache = decoder.new_cache(1, len(prompt) + warm + steps + 8)
    start = clock()
    logits, _ = decoder.forward([prompt], cache, None, pad_id, need_from=[len(prompt) - 1])
    first = clock() - start
    cache.commit_prefix([len(prompt)], len(prompt))
    token, times = int(logits[0, len(prompt) - 1].argmax()), []

    def step() -> float:
        nonlocal token
        start = clock()
        logits, _ = decoder.forward([[token]], cache, None, pad_id)
        cache.commit_prefix([1], 1)
        token = int(logits[0, 0].argmax())
        return clock() - start

    for _ in range(warm):
        step()
    with around():
        times = [step() for _ in range(steps)]
    cache.release()
    return first, times


def width_costs(make, widths: tuple[int, ...], prompt: list[int], steps: int, pad_id: int,
                clock=time.perf_counter) -> dict[int, float]:
    """ms of a plain step (the median of ``steps``) of the decoder ``make(w)`` builds for each pass width ``w``:
    what a pass of ``w`` columns costs (a plain step padded to ``w``, or a verify pass of ``w`` tokens)."""
    return {w: round(statistics.median(decoder_steps(make(w), prompt, steps, pad_id, clock=clock)[1]) * 1e3, 2)
            for w in widths}


@contextmanager
def _regions(decoder) -> Iterator[None]:
    """``torch.profiler`` regions around ``decoder``'s parts for as long as the block runs: ``tandem.linear`` around
    each decoder layer's linear module, ``tandem.attention`` around ``attend``, ``tandem.head`` around ``_head``."""
    from torch.profiler import record_function

    from ..models.quantize import WeightOnlyLinear

    def wrap(fn, name):
        def run(*args, **kwargs):
            with record_function(name):
                return fn(*args, **kwargs)
        return run

    def enter(module, args):
        module._tandem_region = record_function("tandem.linear").__enter__()

    def leave(module, args, out):
        module._tandem_region.__exit__(None, None, None)

    handles = []
    for module in decoder.inner.layers.modules():
        if isinstance(module, (torch.nn.Linear, WeightOnlyLinear)):
            handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    decoder.attend, decoder._head = wrap(decoder.attend, "tandem.attention"), wrap(decoder._head, "tandem.head")
    try:
        yield
    finally:
        del decoder.attend, decoder._head
        for h in handles:
            h.remove()


def torch_step_profile(decoder, prompt: list[int], steps: int, pad_id: int,
                       top: int | None = 12) -> tuple[list[Share], list[Share]]:
    """``steps`` plain steps of a Tandem torch decoder under ``torch.profiler`` (after its prompt call and two
    untimed steps): (by part, ``PARTS``: the regions' times, the rest the steps' total less them; the ``top``
    aten ops by self CPU time, None: all), ms a step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    found = []

    @contextmanager
    def profiled() -> Iterator[None]:
        with profile(activities=[ProfilerActivity.CPU]) as prof, record_function("tandem.steps"):
            yield
        found.append(prof)

    with _regions(decoder):
        decoder_steps(decoder, prompt, steps, pad_id, around=profiled)
    averages = found[0].key_averages()
    total = {e.key: e.cpu_time_total / 1e3 for e in averages if e.key.startswith("tandem.")}
    parts = [(p, total.get(f"tandem.{p}", 0.0)) for p in PARTS[:3]]
    parts.append(("rest", total["tandem.steps"] - sum(ms for _, ms in parts)))
    ops = [(e.key, e.self_cpu_time_total / 1e3) for e in averages if not e.key.startswith("tandem.")]
    return shares(parts, steps), shares(ops, steps)[:top]


def llamacpp_steps(model, prompt: list[int], steps: int, warm: int = 2,
                   clock=time.perf_counter) -> tuple[float, list[float]]:
    """``decoder_steps`` for llama.cpp's own decoding of a ``models.llamacpp`` model (what ``llama.cpp plain``
    runs): the prompt but its last token in one call, that token alone (its logits read), then one token a call."""
    ctx = model.new_context(-(-(len(prompt) + warm + steps + 8) // 256) * 256)
    try:
        start = clock()
        ctx.decode(prompt[:-1], 0, outputs=0)
        token = int(ctx.decode(prompt[-1:], len(prompt) - 1, outputs=1)[0].argmax())
        first, times = clock() - start, []
        for i in range(warm + steps):
            start = clock()
            token = int(ctx.decode([token], len(prompt) + i, outputs=1)[0].argmax())
            if i >= warm:
                times.append(clock() - start)
    finally:
        ctx.close()
    return first, times
