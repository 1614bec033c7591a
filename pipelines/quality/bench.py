"""``tandem bench engine``: side-by-side speed of plain and assisted decoding, in one run, on the same inputs.

Systems: transformers ``generate`` (plain greedy, batch 1), transformers assisted generation (batch 1,
the only batch size it supports), Tandem plain, Tandem assisted at batch 1, and Tandem assisted batched
(4 and 8). Every system's output is compared with transformers' plain greedy output (identical-output
rate). Times are wall-clock for the whole input set, encoder included, after one warm-up input.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..engine import AssistedDecoder, DecodeOptions, PolicyOptions, Rules, as_decoder, model_drafter
from ..engine.rules import rules_from_generation_config


@dataclass
class Workload:
    """One (main, assistant) pair and its inputs, with how to run and normalise each system."""

    name: str
    main_model: object
    assistant_model: object
    items: list[dict]  # per input: {"enc": encoder inputs (batch 1) or None, "prompt": decoder prompt}
    hf_kwargs: dict = field(default_factory=dict)
    max_new_tokens: int = 128
    share_encoder: bool = True
    eos: int = 2
    pad: int = 1
    description: str = ""
    # Decode-only timing: the encoder runs once per input before the clocks start, and every system
    # reads that output (transformers through ``encoder_outputs=``). End-to-end timing includes it.
    end_to_end: bool = False


@dataclass(frozen=True)
class Row:
    pair: str
    system: str
    batch: int
    seconds: float
    tokens: int
    tokens_per_s: float
    speedup: float  # vs transformers plain on the same pair
    calls_per_token: float | None  # main-model decoder passes per token (Tandem only)
    acceptance: float | None
    identical: float  # share of inputs whose output equals transformers plain greedy


def _strip(tokens: list[int], prompt: list[int], eos: int, is_causal: bool, is_whisper: bool) -> list[int]:
    out = list(tokens)
    if is_causal and out[: len(prompt)] == prompt:
        out = out[len(prompt):]
    elif not is_whisper and not is_causal and out and out[0] == prompt[0]:
        out = out[1:]
    if out and out[-1] == eos:
        out = out[:-1]
    return out


def _collate(encs: list[dict], pad: int) -> dict | None:
    """One batch of encoder inputs (batch 1 each), padded on the right, on the inputs' device."""
    if not encs or encs[0] is None:
        return None
    if "input_features" in encs[0]:
        return {"input_features": torch.cat([e["input_features"] for e in encs])}
    width = max(e["input_ids"].shape[1] for e in encs)
    device = encs[0]["input_ids"].device
    ids = torch.full((len(encs), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros(len(encs), width, dtype=torch.long, device=device)
    for b, e in enumerate(encs):
        n = e["input_ids"].shape[1]
        ids[b, :n], mask[b, :n] = e["input_ids"][0], 1
    return {"input_ids": ids, "attention_mask": mask}


def _pad_hidden(h: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(h, (0, 0, 0, width - h.shape[1])) if h.shape[1] < width else h


def _encode_all(w: Workload) -> None:
    """Run the main encoder once per input (decode-only timing)."""
    if w.main_model.config.is_encoder_decoder:
        decoder = as_decoder(w.main_model)
        with torch.inference_mode():
            for item in w.items:
                item["hidden"] = decoder.encode(**item["enc"]).hidden


def _run_hf(w: Workload, assisted: bool) -> tuple[list[list[int]], float]:
    model = w.main_model
    is_causal = not model.config.is_encoder_decoder
    is_whisper = model.config.model_type == "whisper"
    outs = []

    def one(item):
        kwargs = dict(do_sample=False, num_beams=1, max_new_tokens=w.max_new_tokens, **w.hf_kwargs)
        if assisted:
            kwargs["assistant_model"] = w.assistant_model
        if is_causal:
            ids = torch.tensor([item["prompt"]], device=model.device)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        elif w.end_to_end:
            out = model.generate(**item["enc"], **kwargs)
        else:
            from transformers.modeling_outputs import BaseModelOutput

            mask = item["enc"].get("attention_mask")
            extra = {"attention_mask": mask} if mask is not None else {}
            if assisted and "input_ids" in item["enc"]:  # transformers' enc-dec assistant runs its own encoder
                extra["input_ids"] = item["enc"]["input_ids"]
            if is_whisper:  # generate() needs the features' shape even when the encoder output is given
                extra["input_features"] = item["enc"]["input_features"]
            out = model.generate(encoder_outputs=BaseModelOutput(last_hidden_state=item["hidden"]), **extra, **kwargs)
        return _strip(out[0].tolist(), item["prompt"], w.eos, is_causal, is_whisper)

    with torch.inference_mode():
        one(w.items[0])  # warm-up
        start = time.perf_counter()
        outs = [one(item) for item in w.items]
    return outs, time.perf_counter() - start


def _run_tandem(w: Workload, engine: AssistedDecoder, rules_for: Callable[[list[int]], Rules], batch: int,
                policy: PolicyOptions) -> tuple[list[list[int]], float, list]:
    is_causal = not w.main_model.config.is_encoder_decoder
    options = DecodeOptions(max_new_tokens=w.max_new_tokens, policy=policy)

    def run(items):
        enc_inputs = _collate([i["enc"] for i in items], w.pad)
        enc_out = None
        if not w.end_to_end and not is_causal:
            from ..engine import EncoderOutput

            hidden = torch.cat([_pad_hidden(i["hidden"], max(x["hidden"].shape[1] for x in items)) for i in items])
            enc_out = EncoderOutput(hidden, enc_inputs.get("attention_mask"))
        result = engine.generate([i["prompt"] for i in items], rules_for(items[0]["prompt"]), options,
                                 encoder_inputs=enc_inputs, encoder_output=enc_out)
        toks = [list(t[:-1]) if t and t[-1] == w.eos else list(t) for t in result.tokens]
        return toks, result.stats

    run(w.items[:1])  # warm-up
    outs, stats = [], []
    start = time.perf_counter()
    for s in range(0, len(w.items), batch):
        toks, st = run(w.items[s : s + batch])
        outs += toks
        stats.append(st)
    return outs, time.perf_counter() - start, stats


def bench_workload(w: Workload, batches=(4, 8), log=print) -> list[Row]:
    if not w.end_to_end:
        _encode_all(w)
    main = as_decoder(w.main_model)
    drafter = model_drafter(as_decoder(w.assistant_model), w.share_encoder, w.pad)
    assisted = AssistedDecoder(main, drafter, w.pad)
    plain = AssistedDecoder(main, None, w.pad)

    def rules_for(prompt):
        return rules_from_generation_config(w.main_model.generation_config, len(prompt), w.max_new_tokens)

    rows: list[Row] = []
    ref, t_ref = _run_hf(w, assisted=False)
    n_tokens = sum(len(o) for o in ref)

    def add(system, batch, outs, seconds, stats):
        same = sum(o == r for o, r in zip(outs, ref)) / len(ref)
        calls = acc = None
        if stats:
            new = sum(s.new_tokens for s in stats)
            calls = sum(s.row_calls for s in stats) / new if new else None
            drafted = sum(s.drafted for s in stats)
            acc = sum(s.accepted for s in stats) / drafted if drafted else None
        tokens = sum(len(o) for o in outs)
        row = Row(w.name, system, batch, seconds, tokens, tokens / seconds, t_ref / seconds, calls, acc, same)
        rows.append(row)
        log(_format_row(row))

    add("transformers plain", 1, ref, t_ref, None)
    outs, t = _run_hf(w, assisted=True)
    add("transformers assisted", 1, outs, t, None)
    outs, t, st = _run_tandem(w, plain, rules_for, 1, PolicyOptions("constant", 1))
    add("tandem plain", 1, outs, t, st)
    for name in ("constant", "adaptive"):
        outs, t, st = _run_tandem(w, assisted, rules_for, 1, PolicyOptions(name, 5 if name == "constant" else 1))
        add(f"tandem assisted ({name})", 1, outs, t, st)
    for b in batches:
        outs, t, st = _run_tandem(w, assisted, rules_for, b, PolicyOptions("adaptive", 1))
        add("tandem assisted (adaptive)", b, outs, t, st)
    assert n_tokens > 0
    return rows


HEADER = f"{'pair':28s} {'system':30s} {'batch':>5s} {'tok/s':>8s} {'speedup':>8s} {'calls/tok':>9s} {'accept':>7s} {'identical':>9s}"


def _format_row(r: Row) -> str:
    calls = f"{r.calls_per_token:.2f}" if r.calls_per_token is not None else "-"
    acc = f"{r.acceptance:.2f}" if r.acceptance is not None else "-"
    return (f"{r.pair:28s} {r.system:30s} {r.batch:5d} {r.tokens_per_s:8.1f} {r.speedup:7.2f}x {calls:>9s} "
            f"{acc:>7s} {100 * r.identical:8.0f}%")


# ----------------------------------------------------------------------------------------------------
# Workloads


def whisper_workloads(limit: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> list[Workload]:
    """Whisper base with two assistants made from its own decoder (its whole decoder: every draft right; its first
    two layers: drafts mostly wrong) on ``limit`` speech-real (then speech-synth) clips, in ``dtype`` on
    ``device``."""
    from transformers import WhisperFeatureExtractor, WhisperForCausalLM, WhisperForConditionalGeneration

    from ..audio import load_audio
    from ..models.embedded import embedded_path
    from .sets import build_set, read_manifest

    build_set("speech-real")
    items = read_manifest("speech-real")
    try:
        build_set("speech-synth")
        items += read_manifest("speech-synth")
    except Exception:  # noqa: BLE001 - the synthetic set needs flite; the real one is enough to run
        pass
    items = items[:limit]
    base = embedded_path("whisper-base")
    main = WhisperForConditionalGeneration.from_pretrained(base, dtype=dtype).to(device).eval()
    fe = WhisperFeatureExtractor.from_pretrained(base)
    prompt = [50258, 50259, 50359, 50363]
    work = [{"enc": {"input_features": fe(load_audio(i["audio_path"]), sampling_rate=16000,
                                          return_tensors="pt").input_features.to(device, dtype)}, "prompt": prompt}
            for i in items]
    out = []
    for name, folder, what in (("whisper-base+own-decoder", "whisper-base-decoder", "every draft right: pure overhead"),
                               ("whisper-base+truncated-2l", "whisper-base-decoder-2l", "drafts mostly wrong")):
        asst = WhisperForCausalLM.from_pretrained(embedded_path(folder), dtype=dtype).to(device).eval()
        out.append(Workload(name, main, asst, work, {"language": "en", "task": "transcribe"}, 440, True, 50257, 50257, what))
    return out


def toy_workloads(n: int = 16, device: str = "cpu") -> list[Workload]:
    """Random-weight pairs (a 6-layer main, a 1-layer assistant of the same width), float32 on ``device``: the
    engine's overhead and batching on families without real weights here. Random assistants agree with the main
    model rarely."""
    from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=8000, d_model=256, encoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
                  encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=256, pad_token_id=1,
                  bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, tie_word_embeddings=False)
    main = BartForConditionalGeneration(BartConfig(decoder_layers=6, **common)).eval()
    asst = BartForConditionalGeneration(BartConfig(decoder_layers=1, **common)).eval()
    llm = LlamaForCausalLM(LlamaConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
                                       intermediate_size=1024, max_position_embeddings=512, bos_token_id=0,
                                       eos_token_id=2, pad_token_id=1)).eval()
    small = LlamaForCausalLM(LlamaConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=1, num_attention_heads=4,
                                         intermediate_size=1024, max_position_embeddings=512, bos_token_id=0,
                                         eos_token_id=2, pad_token_id=1)).eval()
    for m in (main, asst, llm, small):
        m.to(device)
        m.generation_config = GenerationConfig(eos_token_id=2, pad_token_id=1, decoder_start_token_id=2, bos_token_id=0)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 8000, (int(torch.randint(8, 40, (1,), generator=g)),), generator=g) for _ in range(n)]
    enc_items = [{"enc": {"input_ids": s[None].to(device),
                          "attention_mask": torch.ones(1, len(s), dtype=torch.long, device=device)},
                  "prompt": [2]} for s in seqs]
    causal_items = [{"enc": None, "prompt": s.tolist()} for s in seqs]
    return [
        Workload("random-bart-6l+1l", main, asst, enc_items, {}, 48, True, 2, 1, "random weights"),
        Workload("random-llama-6l+1l", llm, small, causal_items, {}, 48, False, 2, 1, "random weights"),
    ]


def write_report(report: dict, json_path: str | None, log=print) -> dict:
    """Write a benchmark's report as JSON to ``json_path`` (folders made) when one is given; the report."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=1))
        log(f"wrote {json_path}")
    return report


def environment(device: str = "cpu") -> dict:
    """What a figure was measured on: library versions, torch threads, the CPU's model name and the device."""
    import transformers

    from ..devices import cpu_info

    cpu = cpu_info()[1]
    return {"torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads(),
            "cpu": cpu, "python": platform.python_version(), "device": device}


def bench_engine(limit: int = 24, json_path: str | None = None, include_toys: bool = True, end_to_end: bool = False,
                 dtype: str | None = None, log=print, device: str = "cpu") -> dict:
    """Every system on the Whisper workloads (and the random-weight ones) on ``device`` (``devices.resolve_device``'s
    names), the Whisper pairs in ``dtype`` (None: float32 on a CPU, ``devices.resolve_dtype``'s half precision on
    CUDA); prints the table, writes the report to ``json_path`` and returns it."""
    from ..devices import resolve_dtype
    from ..models.loading import torch_dtype

    dtype = resolve_dtype(device, dtype, "float32")
    log(f"environment: {environment(device)}")
    log(f"dtype: {dtype} (Whisper pairs; the random pairs run in float32), device {device}")
    log(f"timing: {'end to end (encoder included)' if end_to_end else 'decode only (encoder output computed once, shared by all systems)'}")
    log(HEADER)
    rows: list[Row] = []
    workloads = whisper_workloads(limit, torch_dtype(dtype), device) + (toy_workloads(device=device) if include_toys else [])
    for w in workloads:
        w.end_to_end = end_to_end
        rows += bench_workload(w, log=log)
    report = {"environment": environment(device), "inputs": limit, "end_to_end": end_to_end, "dtype": dtype,
              "rows": [asdict(r) for r in rows]}
    return write_report(report, json_path, log)


# ----------------------------------------------------------------------------------------------------
# tandem bench asr
