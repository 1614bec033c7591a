"""Why a CPU peer decodes the 1.5B text model faster than Tandem (issue 55): per-token costs on one prompt, and
where a decode step's time goes. ``python -m pipelines.quality.profile_text`` takes translate-udhr's first chat
prompt (as ``tandem bench text --set translate-udhr`` builds it for the default translate pair), ``--threads``
threads everywhere (torch's, llama.cpp's, OpenVINO's ``INFERENCE_NUM_THREADS``, as the benchmark sets them):

- costs: the first token (prompt pass + head) and the median of ``--steps`` plain steps after it, for Tandem's
  main decoder in bfloat16, int8, int4 (``quantize.py``) and q4_k_m (``LlamaCppDecoder``), llama.cpp's own
  one-token step on the same GGUF, and OpenVINO GenAI's ``LLMPipeline`` on the int8 and int4 IR the benchmark
  exports (its ``PerfMetrics``, greedy, ``ignore_eos``; its default backend and ``ATTENTION_BACKEND=SDPA``);
- the weight bytes a step reads (all but the embedding table, of which a step gathers one row);
- OpenVINO's step node by node: the IR compiled with ``PERF_COUNT``, run as the stateful model, each step's
  ``get_profiling_info`` grouped by part (linear: FullyConnected; head; attention; rest), node type, and node
  type + exec type (the CPU plugin's kernel names);
- Tandem's step by part (``torch.profiler`` regions around the layers' linears, ``attend`` and the head) and by
  aten op (self CPU time).

Shares are of the step's summed node (or region) times, in ms a step. Loads and compilation are not timed."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from .profile_steps import (
    CLOCKS,
    EMBEDDING_NAME,
    HEAD_NAME,
    Share,
    StepCost,
    decoder_steps,
    llamacpp_steps,
    megabytes,
    shares,
    torch_step_profile,
    torch_weight_bytes,
    width_costs,
)

WIDTHS = (1, 2, 4, 8)  # pass widths probed (Tandem's torch decoders: 4 columns a pass; q4_k_m 2)
OV_ATTENTION = ("ScaledAttn", "ScaledDotProductAttention", "PagedAttention")  # node types (prefixes)
# the CPU plugin's choices that bear on a step's cost (its defaults: activations' dynamic quantization, KV cache)
OV_PROPERTIES = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION",
                 "DYNAMIC_QUANTIZATION_GROUP_SIZE", "INFERENCE_NUM_THREADS")


def ov_part(node_type: str, node_name: str) -> str:
    """The part of a step an OpenVINO CPU node belongs to (``profile_steps.PARTS``): the FullyConnected named
    ``lm_head`` is the head, other FullyConnected nodes the linears, the attention node types attention."""
    if node_type.startswith("FullyConnected"):  # (FullyConnectedCompressed: int8/int4 weights)
        return "head" if HEAD_NAME in node_name else "linear"
    return "attention" if node_type.startswith(OV_ATTENTION) else "rest"


def ir_weight_bytes(xml_path: Path) -> dict[str, int]:
    """Bytes of an OpenVINO IR's constants by ``"<part> <element type>"`` (part: ``head`` for the constants named
    ``lm_head``, ``layers`` for the rest), the embedding table's constants left out: what one decode step reads.
    Read from the XML alone (each Const's ``element_type`` and ``size``)."""
    import xml.etree.ElementTree as ET

    out: dict[str, int] = defaultdict(int)
    for layer in ET.parse(xml_path).getroot().iter("layer"):
        data = layer.find("data")
        if layer.get("type") != "Const" or data is None or EMBEDDING_NAME in layer.get("name", ""):
            continue
        part = "head" if HEAD_NAME in layer.get("name", "") else "layers"
        out[f"{part} {data.get('element_type')}"] += int(data.get("size", 0))
    return dict(out)


def ov_generate_cost(folder: Path, prompt: list[int], threads: int, steps: int,
                     **properties) -> tuple[float, float, str]:
    """OpenVINO GenAI's ``LLMPipeline`` on IR ``folder`` (``properties`` for its constructor, e.g.
    ``ATTENTION_BACKEND="SDPA"``): ``steps + 1`` greedy tokens after ``prompt`` (``ignore_eos``), the second of
    two runs. Returns its ``PerfMetrics``' (TTFT ms, TPOT ms, the other durations as a line)."""
    import openvino as ov
    import openvino_genai

    pipe = openvino_genai.LLMPipeline(str(folder), "CPU", INFERENCE_NUM_THREADS=threads, **properties)
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens, config.do_sample, config.ignore_eos = steps + 1, False, True
    ids = np.array([prompt], dtype=np.int64)
    inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
    pipe.generate(inputs, config)
    cpu = time.process_time()
    result = pipe.generate(inputs, config)
    cpu = time.process_time() - cpu
    m = result.perf_metrics
    notes = (f"generate {m.get_generate_duration().mean:.1f} ms, inference {m.get_inference_duration().mean:.1f} ms, "
             f"tokenization {m.get_tokenization_duration().mean:.2f} ms, {m.get_num_generated_tokens()} tokens, "
             f"TPOT std {m.get_tpot().std:.2f} ms, process CPU time {cpu * 1e3:.0f} ms")
    return round(m.get_ttft().mean, 2), round(m.get_tpot().mean, 2), notes


def ov_prompts_cost(folder: Path, prompts: list[list[int]], threads: int, max_new: int, eos: tuple[int, ...],
                    prefix_caching: bool | None) -> dict:
    """``LLMPipeline`` on IR ``folder`` as ``peers_text`` runs it (greedy, ``eos`` stops, at most ``max_new`` tokens)
    over ``prompts`` after the shortest as warm-up; ``prefix_caching`` set in a ``SchedulerConfig`` (None: the
    pipeline's default). Returns the wall and process CPU seconds of the prompts, the new tokens and each
    prompt's TTFT (ms): prefix caching keeps earlier prompts' KV blocks, so a prompt's prefix seen before
    (the chat template's system part, the warm-up prompt itself) is not computed again."""
    import openvino as ov
    import openvino_genai

    extra = {}
    if prefix_caching is not None:
        extra["scheduler_config"] = openvino_genai.SchedulerConfig()
        extra["scheduler_config"].enable_prefix_caching = prefix_caching
    pipe = openvino_genai.LLMPipeline(str(folder), "CPU", INFERENCE_NUM_THREADS=threads, **extra)
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens, config.do_sample, config.stop_token_ids = max_new, False, set(eos)

    def generate(prompt: list[int]):
        ids = np.array([prompt], dtype=np.int64)
        return pipe.generate(openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config)

    generate(min(prompts, key=len))
    wall, cpu, ttft, tokens = time.perf_counter(), time.process_time(), [], 0
    for prompt in prompts:
        result = generate(prompt)
        ttft.append(round(result.perf_metrics.get_ttft().mean, 1))
        tokens += len(result.tokens[0])
    return {"wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2),
            "tokens": tokens, "ttft_ms": ttft}


def ov_step_profile(folder: Path, prompt: list[int], threads: int, steps: int, clock=time.perf_counter) -> dict:
    """The IR's stateful model compiled for the CPU with ``PERF_COUNT`` (``INFERENCE_NUM_THREADS=threads``, the
    plugin's other defaults): the prompt, two untimed steps, then ``steps`` one-token greedy steps, each one's
    ``get_profiling_info`` kept; then 3 passes of each width of ``WIDTHS`` tokens. Returns ``{"first_ms",
    "step_ms" (median wall), "parts", "types", "kernels" (Share lists, ms a step: by ``ov_part``, by node type, by
    node type + exec type), "widths" (ms a pass by width), "properties"}``; times by ``clock``."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(folder / "openvino_model.xml"), "CPU",
                                       {"PERF_COUNT": True, "INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    request.reset_state()

    def run(ids: list[int], start: int) -> int:
        n = len(ids)
        request.infer({"input_ids": np.array([ids], dtype=np.int64),
                       "attention_mask": np.ones((1, start + n), dtype=np.int64),
                       "position_ids": np.arange(start, start + n, dtype=np.int64)[None],
                       "beam_idx": np.zeros(1, dtype=np.int32)})
        return int(request.get_tensor("logits").data[0, -1].argmax())

    run(prompt, 0)  # the first inference of a shape compiles its kernels: not timed
    request.reset_state()
    begin = clock()
    token = run(prompt, 0)
    first, times, nodes = clock() - begin, [], []
    for i in range(2 + steps):
        begin = clock()
        token = run([token], len(prompt) + i)
        if i >= 2:
            times.append(clock() - begin)
            nodes += [(p.node_type, p.exec_type, p.node_name, p.real_time.total_seconds() * 1e3)
                      for p in request.get_profiling_info()]
    position, widths = len(prompt) + 2 + steps, {}
    for w in WIDTHS:  # what a pass of w tokens costs (a verify pass's shape), 3 each, the median
        passes = []
        for _ in range(3):
            begin = clock()
            run([token] * w, position)
            passes.append(clock() - begin)
            position += w
        widths[w] = round(statistics.median(passes) * 1e3, 2)
    supported = compiled.get_property("SUPPORTED_PROPERTIES")
    properties = {key: str(compiled.get_property(key)) for key in OV_PROPERTIES if key in supported}
    return {"first_ms": round(first * 1e3, 1), "step_ms": round(statistics.median(times) * 1e3, 2),
            "parts": shares(((ov_part(t, n), ms) for t, _, n, ms in nodes), steps),
            "types": shares(((t, ms) for t, _, _, ms in nodes), steps)[:12],
            "kernels": shares(((f"{t} {e}", ms) for t, e, _, ms in nodes), steps)[:12],
            "nodes": shares(((n, ms) for _, _, n, ms in nodes), steps)[:6],
            "widths": widths, "properties": properties}


def _line(shares_: list[Share], top: int = 8) -> str:
    """The first ``top`` of ``shares_`` on one line."""
    return " | ".join(f"{s.name} {s.ms:.1f} ms {s.share:.0%}" for s in shares_[:top])


def _torch_rows(pair, given: dict, prompt: list[int], dtypes: list[str], steps: int, profile_steps: int, clock,
                log) -> dict:
    """``decoder_steps``, ``width_costs`` and ``torch_step_profile`` of the pair's main model in each torch dtype
    of ``dtypes``: ``given``'s model for it (taken out of it), else loaded in bfloat16 and quantized as
    ``pairs.load_pair`` does."""
    from ..engine import as_decoder
    from ..engine.causal import FixedCausalDecoder
    from ..models.loading import load_model
    from ..models.pairs import pad_id_of
    from ..models.quantize import quantize_model

    report = {}
    for dtype in dtypes:
        model = given.pop(dtype, None)
        if model is None:
            model = load_model(pair.main, "bfloat16")
            quantize_model(model, dtype)
        decoder, pad = as_decoder(model), pad_id_of(model)
        first, times = decoder_steps(decoder, prompt, steps, pad, clock=clock)
        parts, ops = torch_step_profile(decoder, prompt, profile_steps, pad)
        widths = width_costs(lambda w: FixedCausalDecoder(model, width=w), WIDTHS, prompt, profile_steps, pad, clock)
        weights = torch_weight_bytes(model)
        cost = StepCost.timed(f"Tandem {dtype}", first, times, megabytes(weights),
                              f"width {decoder.width}; ms a pass by width {widths}")
        report[cost.system] = {"cost": asdict(cost), "bytes": weights, "widths": widths,
                               "parts": [asdict(s) for s in parts], "ops": [asdict(s) for s in ops]}
        log(f"cost  {cost.system}: first {cost.first_ms} ms, step {cost.step_ms} ms, {cost.weight_mb} MB a step "
            f"({cost.notes})")
        log(f"parts {cost.system}: {_line(parts)}")
        log(f"ops   {cost.system}: {_line(ops)}")
    return report


def _llamacpp_rows(pair, prompt: list[int], threads: int, steps: int, clock, log) -> dict:
    """Tandem q4_k_m's plain step (``LlamaCppDecoder``, its fixed width) and llama.cpp's own on the same file."""
    from ..engine.llamacpp import LlamaCppDecoder
    from ..models.llamacpp import gguf_file, load_llamacpp
    from ..models.pairs import pad_id_of

    model = load_llamacpp(pair.main, threads)
    size = round(gguf_file(pair.main).stat().st_size / 1e6, 1)
    decoder = LlamaCppDecoder(model)
    runs = {"Tandem q4_k_m": decoder_steps(decoder, prompt, steps, pad_id_of(model), clock=clock),
            "llama.cpp plain": llamacpp_steps(model, prompt, steps, clock=clock)}
    widths = width_costs(lambda w: LlamaCppDecoder(model, width=w), WIDTHS, prompt, steps // 2, pad_id_of(model),
                         clock)
    report = {}
    for system, (first, times) in runs.items():
        width = (f"widths {decoder.low}-{decoder.high}; ms a pass by width {widths}" if system.startswith("Tandem")
                 else "width 1")
        cost = StepCost.timed(system, first, times, None, f"{width}, GGUF file {size} MB with the embeddings")
        report[system] = {"cost": asdict(cost)}
        log(f"cost  {system}: first {cost.first_ms} ms, step {cost.step_ms} ms ({cost.notes})")
    return report


def _openvino_rows(pair, prompt: list[int], formats: list[str], threads: int, steps: int, profile_steps: int,
                   clock, log) -> dict:
    """``ov_generate_cost`` (its default backend and SDPA) and ``ov_step_profile`` of the IR in each format."""
    report = {}
    for fmt in formats:
        folder = _ov_folder(pair, fmt, log)
        system, weights = f"OpenVINO {fmt}", ir_weight_bytes(folder / "openvino_model.xml")
        costs = {"": ov_generate_cost(folder, prompt, threads, steps),
                 " SDPA": ov_generate_cost(folder, prompt, threads, steps, ATTENTION_BACKEND="SDPA")}
        profiled = ov_step_profile(folder, prompt, threads, profile_steps, clock)
        for backend, (ttft, tpot, notes) in costs.items():
            cost = StepCost(system + backend, ttft, tpot, steps, megabytes(weights), notes)
            report[cost.system] = {"cost": asdict(cost)}
            log(f"cost  {cost.system}: TTFT {cost.first_ms} ms, TPOT {cost.step_ms} ms, {cost.weight_mb} MB a step "
                f"({cost.notes})")
        report[system].update(bytes=weights, **{k: [asdict(s) for s in v] if isinstance(v, list) else v
                                                for k, v in profiled.items()})
        log(f"nodes {system}: stateful SDPA model, first {profiled['first_ms']} ms, step {profiled['step_ms']} ms "
            f"under PERF_COUNT; ms a pass by width {profiled['widths']}; {profiled['properties']}")
        for key in ("parts", "types", "kernels", "nodes"):
            log(f"{key:<5} {system}: {_line(profiled[key])}")
    return report


def _prefix_caching_rows(pair, prompts: list[list[int]], model, formats: list[str], threads: int, json_path,
                         log) -> dict:
    """``ov_prompts_cost`` of each format's IR by default, with prefix caching and without, on ``prompts`` (128 new
    tokens at most, the main model's eos ids), and the prompts' shared prefixes (tokens in common with any
    earlier prompt, the warm-up included)."""
    from ..engine import rules_from_generation_config

    eos = rules_from_generation_config(model.generation_config, 1, 1).eos
    seen = [min(prompts, key=len)]
    shared = []
    for p in prompts:
        shared.append(max(next((i for i, (a, b) in enumerate(zip(p, q)) if a != b), min(len(p), len(q)))
                          for q in seen))
        seen.append(p)
    report = {"prompt_tokens": [len(p) for p in prompts], "shared_prefix_tokens": shared}
    log(f"prompts: {report['prompt_tokens']} tokens, of which shared with an earlier prompt: {shared}")
    for fmt in formats:
        folder = _ov_folder(pair, fmt, log)
        for caching in (None, True, False):
            name = f"OpenVINO {fmt}, prefix caching {'default' if caching is None else caching}"
            report[name] = ov_prompts_cost(folder, prompts, threads, 128, eos, caching)
            log(f"{name}: {report[name]}")
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def _ov_folder(pair, fmt: str, log) -> Path:
    """The IR folder of ``pair``'s main model in ``fmt`` (``peers.ov_ir_folder``: exported once)."""
    from ..models.embedded import embedded_path
    from ..models.embedded_gguf import GGUF
    from .peers import OV_TEXT_TASK, ov_ir_folder

    return ov_ir_folder(pair.main.id, embedded_path(pair.main.id), GGUF[pair.main.id].sha256, OV_TEXT_TASK, fmt, log)


SYSTEMS = ("bfloat16", "int8", "int4", "q4_k_m", "openvino-int8", "openvino-int4")


def main(argv: list[str] | None = None) -> dict:
    """``python -m pipelines.quality.profile_text``: the figures as lines (``cost``, ``parts``, ``ops``, ``nodes``,
    ``types``, ``kernels``), and with ``--json`` in a file."""
    from ..models.registry import load_registry
    from ..text import TextRunner
    from .bench_text import bench_prompts

    p = argparse.ArgumentParser(prog="python -m pipelines.quality.profile_text", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="threads of every system (default 2)")
    p.add_argument("--steps", type=int, default=16, help="timed plain steps after the prompt (default 16)")
    p.add_argument("--profile-steps", type=int, default=4, help="steps under the profilers (default 4)")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                   help="wall, or cpu: the process's CPU time (steadier on a shared machine, at --threads 1)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    p.add_argument("--prefix-caching", action="store_true",
                   help="instead: OpenVINO on translate-udhr's prompts as the benchmark runs them, with its prefix "
                        "caching by default, on and off (ov_prompts_cost)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    torch.set_num_threads(args.threads)
    pair = load_registry().default("translate")
    runner = TextRunner(pair, "bfloat16")
    prompts, given, clock = bench_prompts(runner, "translate", 3), {"bfloat16": runner.model}, CLOCKS[args.clock]
    prompt = prompts[0]
    del runner  # (its assistant: not measured; the bfloat16 main model goes once measured)
    print(f"pair {pair.name}, translate-udhr's first prompt ({len(prompt)} tokens), {args.threads} threads", flush=True)
    log = lambda line: print(line, flush=True)  # noqa: E731
    formats = [s.removeprefix("openvino-") for s in systems if s.startswith("openvino-")]
    if args.prefix_caching:
        return _prefix_caching_rows(pair, prompts, given["bfloat16"], formats, args.threads, args.json, log)
    report: dict = {"pair": pair.name, "prompt_tokens": len(prompt), "threads": args.threads, "clock": args.clock}
    report.update(_torch_rows(pair, given, prompt, [s for s in systems if s in ("bfloat16", "int8", "int4")],
                              args.steps, args.profile_steps, clock, log))
    if "q4_k_m" in systems:
        report.update(_llamacpp_rows(pair, prompt, args.threads, args.steps, clock, log))
    report.update(_openvino_rows(pair, prompt, formats, args.threads, args.steps, args.profile_steps, clock, log))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
