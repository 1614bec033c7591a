"""``tandem bench shapes``: what assisted decoding gains at a model's real shapes, without its weights.

A user with hub access can judge a large pair that cannot be loaded here (whisper-large-v3 with a 2-layer
assistant, as distil-large-v3 is) from this: random-weight models shaped like it (decoder layers, d_model,
heads, feed-forward width, the full-vocabulary head) run through the same engine, and an oracle drafter
whose acceptance is fixed. The oracle runs the real 2-layer assistant for every draft step (so drafting
costs what it would) and then replaces its tokens by the main model's own greedy tokens, each kept with
probability ``acceptance`` (a wrong token after it rejects the rest): the speed-up against acceptance at the
real step costs. Side by side in one run: transformers' eager ``generate`` (plain greedy), Tandem plain, and
Tandem assisted at each acceptance; every assisted output is checked equal to Tandem plain's.

With ``beam_size`` (``--beam-size N``): beam search, whisper's semantics (``engine.beam``), the same systems with
N beams a row (transformers' ``generate(num_beams=N)``, whose beam search keeps other candidates: timed, not
compared). The oracle then knows plain beam search's tree (recorded by a first plain run): for each beam it
proposes the tokens its best child, grandchild, ... got, every drafted step right for all beams with
probability ``acceptance`` (one draw per step and input, shared by its beams: an input's step is kept only
when every one of its beams' drafts is its own continuation). A step plain beam search took by branching (a beam with two children,
another with none) is never kept whatever the drafts: ``beam steps drafted at best`` counts the others.

The encoder is not timed: its output is a random (rows, 1500, d_model) tensor shared by every system.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass

import torch

from ..engine import (
    AssistedDecoder,
    BeamOptions,
    DecodeOptions,
    PolicyOptions,
    Rules,
    as_decoder,
    beam_generate,
    model_drafter,
)
from ..engine.decoders import EncoderOutput
from ..engine.drafters import Drafter, DrafterFactory, Drafts

# Decoder shapes of the OpenAI checkpoints (their config.json on the hub).
SHAPES = {
    "whisper-base": {"d_model": 512, "decoder_layers": 6, "decoder_attention_heads": 8, "decoder_ffn_dim": 2048,
                     "vocab_size": 51865},
    "whisper-large-v3": {"d_model": 1280, "decoder_layers": 32, "decoder_attention_heads": 20, "decoder_ffn_dim": 5120,
                         "vocab_size": 51866},
}
PROMPT = [1, 2, 3]  # any ids: the models are random


@dataclass(frozen=True)
class ShapeRow:
    system: str
    acceptance: float | None  # the oracle's per-token acceptance (assisted rows)
    lookahead: int | None  # drafts per round (assisted rows)
    seconds: float  # decoding wall time, all rows, encoder not included
    tokens: int
    tokens_per_call: float | None  # tokens per main-model pass per row
    speedup: float  # against Tandem plain: its seconds / these
    vs_generate: float  # against transformers' eager generate: its seconds / these
    identical: bool | None  # equal to Tandem plain's tokens (assisted rows)


def random_whisper(shape: dict, layers: int, dtype: torch.dtype, device: str, causal: bool, seed: int):
    """A Whisper model with random weights and ``shape``'s decoder (``layers`` of them); the encoder is one
    small layer (never run). ``causal``: a decoder-only WhisperForCausalLM (the assistant)."""
    from transformers import WhisperConfig, WhisperForCausalLM, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    config = WhisperConfig(**dict(shape, decoder_layers=layers), encoder_layers=1, encoder_attention_heads=2,
                           encoder_ffn_dim=64, max_source_positions=1500, max_target_positions=448,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    cls = WhisperForCausalLM if causal else WhisperForConditionalGeneration
    return cls(config).to(device=device, dtype=dtype).eval()


class OracleDrafter(Drafter):
    """Runs ``inner`` (a model drafter: the real draft cost), then proposes the main model's own next tokens
    (``reference``, per row), each kept with probability ``acceptance``, a wrong one after the first miss."""

    def __init__(self, inner: Drafter, reference: list[list[int]], acceptance: float, rng: random.Random,
                 vocab: int) -> None:
        self.inner, self.reference, self.acceptance, self.rng, self.vocab = inner, reference, acceptance, rng, vocab
        self.rows = list(range(len(reference)))

    def start(self, prompts, enc, encoder_inputs) -> int:
        return self.inner.start(prompts, enc, encoder_inputs)

    def draft(self, ks, seqs, gen_lens, sampling, generator, stop_below) -> Drafts:
        d = self.inner.draft(ks, seqs, gen_lens, sampling, generator, stop_below)
        tokens = []
        for b, drafted in enumerate(d.tokens):
            truth = self.reference[self.rows[b]][gen_lens[b]: gen_lens[b] + len(drafted)]
            # the first miss: each token is right with probability `acceptance`, independently
            hit = next((j for j in range(len(truth)) if self.rng.random() >= self.acceptance), len(truth))
            tokens.append(truth[:hit] + [(t + 1) % self.vocab for t in truth[hit:]])
        return Drafts(tokens, None, d.steps, d.seconds)

    def update(self, drafted, accepted, emitted) -> None:
        self.inner.update(drafted, accepted, emitted)

    def finish(self) -> None:
        self.inner.finish()  # the inner drafter's pooled static cache goes back to its pool

    def select(self, keep: list[int], same_encoder: bool = False) -> None:
        self.rows = [self.rows[i] for i in keep]
        self.inner.select(keep, same_encoder)


def oracle(inner: DrafterFactory, reference: list[list[int]], acceptance: float, vocab: int, seed: int = 0) -> DrafterFactory:
    def make(rules: Rules, max_new_tokens: int) -> Drafter:
        return OracleDrafter(inner(rules, max_new_tokens), reference, acceptance, random.Random(seed), vocab)

    return make


class BeamRecorder(Drafter):
    """Drafts nothing (the lookahead is 0) and records plain beam search's tree: ``tree[g, seq]`` the token of
    ``seq``'s best child in input g's beams (row r is one of input r // beam_size's; sequences with the
    prompt); ``steps`` and ``kept`` the steps taken and those whose new beams are one child of each beam (the
    only steps drafts can cover)."""

    def __init__(self, beam_size: int) -> None:
        self.n = beam_size
        self.tree: dict[tuple[int, tuple[int, ...]], int] = {}
        self.seqs: list[tuple[int, ...]] = []
        self.steps = self.kept = 0

    def start(self, prompts, enc, encoder_inputs) -> int:
        self.seqs = [tuple(p) for p in prompts]
        return 0

    def draft(self, ks, seqs, gen_lens, sampling, generator, stop_below) -> Drafts:
        return Drafts([[] for _ in ks], None, 0, 0.0)

    def update(self, drafted, accepted, emitted) -> None:
        for b, tokens in enumerate(emitted):
            for t in tokens:
                self.tree.setdefault((b // self.n, self.seqs[b]), t)  # new beams come best first: the best child
                self.seqs[b] += (t,)

    def select(self, keep: list[int], same_encoder: bool = False) -> None:
        for g in range(0, len(keep), self.n):  # per input: its beams' sources (a plain round steps every input once)
            self.steps += 1
            self.kept += sorted(keep[g : g + self.n]) == list(range(g, g + self.n))
        self.seqs = [self.seqs[i] for i in keep]


class BeamOracle(OracleDrafter):
    """Runs ``inner`` (the real draft cost), then proposes each beam's continuation in plain beam search's tree
    (``BeamRecorder.tree``), every drafted step right for all of an input's beams with probability
    ``acceptance`` (one draw a step and input), a wrong token after the first miss."""

    def __init__(self, inner: Drafter, recorder: BeamRecorder, acceptance: float, rng: random.Random,
                 vocab: int) -> None:
        super().__init__(inner, [], acceptance, rng, vocab)
        self.tree, self.n = recorder.tree, recorder.n

    def draft(self, ks, seqs, gen_lens, sampling, generator, stop_below) -> Drafts:
        d = self.inner.draft(ks, seqs, gen_lens, sampling, generator, stop_below)
        hits: dict[int, int] = {}  # per input: the drafted steps its beams get right
        tokens = []
        for b, (seq, drafted) in enumerate(zip(seqs, d.tokens)):
            if b // self.n not in hits:
                hits[b // self.n] = next((j for j in range(max(ks)) if self.rng.random() >= self.acceptance), max(ks))
            hit = hits[b // self.n]
            seq, truth = tuple(seq), []
            while len(truth) < len(drafted) and (b // self.n, seq) in self.tree:
                truth.append(self.tree[b // self.n, seq])
                seq += (truth[-1],)
            tokens.append(truth[:hit] + [(t + 1) % self.vocab for t in truth[hit:]])
        return Drafts(tokens, None, d.steps, d.seconds)

    def select(self, keep: list[int], same_encoder: bool = False) -> None:
        self.inner.select(keep, same_encoder)


def beam_oracle(inner: DrafterFactory, recorder: BeamRecorder, acceptance: float, vocab: int,
                seed: int = 0) -> DrafterFactory:
    def make(rules: Rules, max_new_tokens: int) -> Drafter:
        return BeamOracle(inner(rules, max_new_tokens), recorder, acceptance, random.Random(seed), vocab)

    return make


def _hf_generate(model, hidden: torch.Tensor, tokens: int, beams: int = 1) -> tuple[float, list[list[int]]]:
    """transformers' own eager generate (GenerationMixin's, greedy or ``beams`` beams), exactly ``tokens`` new
    tokens per row."""
    from transformers import GenerationMixin
    from transformers.modeling_outputs import BaseModelOutput

    prompt = torch.tensor([PROMPT] * hidden.shape[0], device=hidden.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = GenerationMixin.generate(model, encoder_outputs=BaseModelOutput(last_hidden_state=hidden),
                                       decoder_input_ids=prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                                       do_sample=False, num_beams=beams, eos_token_id=None)
    return time.perf_counter() - start, out[:, len(PROMPT):].tolist()


def bench_shapes(shape: str = "whisper-base", tokens: int = 64, rows: int = 1, acceptances=(0.6, 0.8, 0.9),
                 lookaheads: tuple[int, ...] = (3,), dtype: str | None = None, device: str = "cpu",
                 assistant_layers: int = 2, json_path: str | None = None, log=print, width: int | None = None,
                 beam_size: int | None = None) -> dict:
    """Every system on the same random encoder output, ``tokens`` new tokens per row (no end-of-sequence:
    the random models run to the length). ``lookaheads``: the drafts per round, one assisted row per lookahead
    and acceptance (a constant policy: a verify over lookahead + 1 columns, in passes of the main decoder's
    width). ``width``: the main decoder's pass width, plain and assisted alike (default: the device's,
    ``engine.whisper.step_shape``). ``beam_size``: beam search with that many beams a row (module docstring).
    Returns the report (also written to ``json_path``). ``dtype``: default float32 on a CPU,
    devices.resolve_dtype's on CUDA."""
    from ..devices import int8_allowed, resolve_dtype
    from ..models.loading import torch_dtype
    from .bench import environment, write_report

    dtype = resolve_dtype(device, dtype, "float32")
    dt = torch_dtype(dtype)
    spec = SHAPES[shape]
    start = time.perf_counter()
    main_model = random_whisper(spec, spec["decoder_layers"], dt, device, causal=False, seed=0)
    assistant = random_whisper(spec, assistant_layers, dt, device, causal=True, seed=1)
    log(f"environment: {environment(device)}")
    log(f"shape {shape} ({spec['decoder_layers']} decoder layers, d_model {spec['d_model']}, vocabulary "
        f"{spec['vocab_size']}), assistant {assistant_layers} layers, random weights, {dtype}, {rows} row(s), "
        f"{tokens} tokens, main pass width {width or 'the device default'}"
        + (f", beam search {beam_size} beams a row" if beam_size else "")
        + f"; built in {time.perf_counter() - start:.1f} s")
    torch.manual_seed(2)
    hidden = torch.randn(rows, 1500, spec["d_model"], dtype=dt, device=device)
    enc = EncoderOutput(hidden, None)
    main = as_decoder(main_model)
    if width is not None:
        main.width = width
    prompts = [list(PROMPT)] * rows

    def run(engine: AssistedDecoder, lookahead: int = 1):
        options = DecodeOptions(max_new_tokens=tokens, policy=PolicyOptions("constant", lookahead))
        begin = time.perf_counter()
        if beam_size:
            result = beam_generate(engine, prompts, Rules(), options, BeamOptions(beam_size), encoder_output=enc)
        else:
            result = engine.generate(prompts, Rules(), options, encoder_output=enc)
        return time.perf_counter() - begin, result

    beams = beam_size or 1
    _hf_generate(main_model, hidden, 4, beams)  # warm-up
    hf_s, _ = _hf_generate(main_model, hidden, tokens, beams)
    run(AssistedDecoder(main, None))  # warm-up
    plain_s, plain = run(AssistedDecoder(main, None))
    reference = [list(t) for t in plain.tokens]
    out = [ShapeRow("transformers generate (eager)", None, None, hf_s, rows * tokens, None, plain_s / hf_s, 1.0, None),
           ShapeRow("tandem plain", None, None, plain_s, plain.stats.new_tokens, 1.0, 1.0, hf_s / plain_s, None)]
    recorder = BeamRecorder(beams)
    if beam_size:  # plain beam search's tree, for the oracle (a lookahead of 0: the recorder drafts nothing)
        run(AssistedDecoder(main, lambda rules, max_new: recorder), 0)
        log(f"beam steps drafted at best: {recorder.kept} of {recorder.steps} (the steps whose new beams are one "
            "child of each beam)")
    # the assistant as pairs load it: the lean draft decoder, int8 weights where the device has the kernels
    draft = model_drafter(as_decoder(assistant, assistant=True, int8=int8_allowed(device)), share_encoder=True, pad_id=0)
    for k in lookaheads:
        for a in acceptances:
            make = (beam_oracle(draft, recorder, a, spec["vocab_size"]) if beam_size
                    else oracle(draft, reference, a, spec["vocab_size"]))
            engine = AssistedDecoder(main, make)
            run(engine, k)  # warm-up
            seconds, result = run(engine, k)
            s = result.stats
            name = f"tandem assisted, acceptance {a}" + (f", k {k}" if len(lookaheads) > 1 else "")
            # beam search: steps a main pass covers, drafted ones (``accepted`` counts each beam's) and its own
            per_call = ((s.accepted / (beams * rows) + s.main_calls) / max(s.main_calls, 1) if beam_size
                        else s.new_tokens / max(s.row_calls, 1))
            out.append(ShapeRow(name, a, k, seconds, s.new_tokens, per_call,
                                plain_s / seconds, hf_s / seconds, [list(t) for t in result.tokens] == reference))
    log(f"{'system':36s} {'seconds':>8s} {'tok/s':>8s} {'tok/call':>8s} {'vs plain':>8s} {'vs generate':>11s} {'identical':>9s}")
    for r in out:
        tpc = f"{r.tokens_per_call:8.2f}" if r.tokens_per_call else f"{'-':>8s}"
        same = f"{'-':>9s}" if r.identical is None else f"{'yes' if r.identical else 'NO':>9s}"
        log(f"{r.system:36s} {r.seconds:8.2f} {r.tokens / r.seconds:8.1f} {tpc} {r.speedup:7.2f}x {r.vs_generate:10.2f}x {same}")
    report = {"environment": environment(device), "shape": shape, "dtype": dtype, "rows": rows, "tokens": tokens,
              "lookaheads": list(lookaheads), "width": width, "assistant_layers": assistant_layers,
              "beam_size": beam_size, "beam_steps": [recorder.kept, recorder.steps] if beam_size else None,
              "rows_out": [asdict(r) for r in out]}
    return write_report(report, json_path, log)


@dataclass(frozen=True)
class StepCost:
    part: str  # "main step" (1 token), "verify pass" (lookahead + 1 tokens), "draft step" (1 token)
    path: str  # "eager", or "graphs" (the CUDA fast path: static caches, captured passes replayed)
    wall_ms: float  # per call: the mean of repeated calls, the device synchronised after the last
    kernel_ms: float | None  # per call, the device's kernel time of this path (torch.profiler; CUDA only)


def step_costs(shape: str = "whisper-base", dtype: str | None = None, device: str = "cpu", lookahead: int = 3,
               repeats: int = 30, log=print, width: int | None = None) -> list[StepCost]:
    """One row, a cache of 40 tokens, random weights at ``shape``: the wall time of a main-decoder step, a
    verify pass over ``lookahead`` + 1 tokens and a 2-layer draft step (on CUDA in half precision also one
    in float32, the draft's dtype there before 2026-12-04), eager and (CUDA) on the graph fast
    path, beside each path's own kernel time on CUDA (``torch.profiler``'s device time; where the profiler
    does not trace the kernels inside a graph replay, the graphs' row reads 0). The two paths run on their own caches: eager the main decoder's
    fresh static cache and the drafter's ragged one, the fast path the pooled static caches (scratch-slot
    writes, draft attention over every slot), so their kernels differ a little. On the fixed-shape path a
    main step and a verify pass of at most the width (8 on CUDA) are the same pass. Each call is repeated
    ``repeats`` times (main calls at the same position, nothing committed; draft steps committed, the cache
    growing a token a call, as drafting does) after warm-up calls that also capture the graphs; the wall
    time is the mean, the device synchronised after the last call."""
    from ..devices import int8_allowed, resolve_dtype
    from ..engine.whisper import WhisperDraftDecoder
    from ..models.loading import torch_dtype

    dtype = resolve_dtype(device, dtype, "float32")
    dt, spec, cuda = torch_dtype(dtype), SHAPES[shape], torch.device(device).type == "cuda"
    main_model = random_whisper(spec, spec["decoder_layers"], dt, device, causal=False, seed=0)
    assistant = random_whisper(spec, 2, dt, device, causal=True, seed=1)
    torch.manual_seed(2)
    hidden = torch.randn(1, 1500, spec["d_model"], dtype=dt, device=device)
    prompt = list(range(3, 43))
    out = []
    for path in ("eager", "graphs") if cuda else ("eager",):
        with torch.inference_mode():
            main = as_decoder(main_model)
            main.width = width or main.width  # the main decoder's pass width (None: the device's)
            draft = as_decoder(assistant, assistant=True, int8=int8_allowed(device))
            main.graphs = draft.graphs = "capture" if path == "graphs" else None
            cache = main.new_cache(1, capacity=448)
            _, real = main.forward([prompt], cache, EncoderOutput(hidden, None), 0, need_from=[len(prompt) - 1])
            cache.commit(real, [len(prompt)])
            drafts = {"draft step": draft}
            if draft.dtype != torch.float32:  # beside it, the same draft step in float32 (before 2026-12-04)
                drafts["draft step, float32"] = WhisperDraftDecoder(assistant, dtype=torch.float32)
                drafts["draft step, float32"].graphs = draft.graphs
            draft_caches = {}
            for part, d in drafts.items():
                draft_caches[part] = d.new_cache(1, capacity=448)
                _, real = d.forward([prompt], draft_caches[part], EncoderOutput(hidden.to(d.dtype), None), 0)
                draft_caches[part].commit(real, [len(prompt)])
        one = torch.tensor([[5]], device=device)
        yes = torch.ones(1, 1, dtype=torch.bool, device=device)
        calls = {
            "main step": lambda: main.forward([[5]], cache, None, 0),
            f"verify pass ({lookahead + 1} tokens)": lambda: main.forward([[5] * (lookahead + 1)], cache, None, 0),
        }
        for part, d in drafts.items():
            calls[part] = lambda d=d, c=draft_caches[part]: (d.forward_ids(one, yes, c, None), c.commit(yes, [1]))
        for part, call in calls.items():
            wall, kernels = _time_call(call, repeats, cuda)
            out.append(StepCost(part, path, wall, kernels))
        cache.release()
        for c in draft_caches.values():
            c.release()
    log(f"step costs at {shape}'s shapes, {dtype}, {device}, 1 row, a 40-token cache, main pass width "
        f"{width or 'the device default'} (ms a call):")
    log(f"{'part':28s} {'path':7s} {'wall ms':>8s} {'kernel ms':>9s}")
    for c in out:
        log(f"{c.part:28s} {c.path:7s} {c.wall_ms:8.3f} {'-' if c.kernel_ms is None else f'{c.kernel_ms:.3f}':>9s}")
    return out


def _time_call(call, repeats: int, cuda: bool) -> tuple[float, float | None]:
    """(wall ms, kernel ms) per call of ``call`` (after three warm-up calls); kernel time on CUDA only."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.inference_mode():
        for _ in range(3):
            call()
        sync()
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        sync()
        wall = (time.perf_counter() - start) * 1000 / repeats
        kernels = None
        if cuda:
            from torch.profiler import ProfilerActivity, profile as trace

            with trace(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(repeats):
                    call()
                sync()
            kernels = sum(_self_device_us(e) for e in prof.key_averages()) / 1000 / repeats
    return wall, kernels


def _self_device_us(event) -> float:
    """An averaged profiler event's own device time in microseconds (the attribute's name by torch version)."""
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)))
