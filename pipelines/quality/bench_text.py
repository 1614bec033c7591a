"""``tandem bench text``: a text pair's systems side by side, in one run, on the same chat prompts, batch 1.

Systems: transformers ``generate`` (plain greedy), transformers assisted generation with the pair's
assistant, Tandem plain, and Tandem assisted with each drafter (the assistant model, prompt lookup, both).
Every system decodes the prompts ``TextRunner.chat_prompts`` makes for the task (summarize-own documents;
translate-udhr paragraphs of at most ``MAX_WORDS`` words from English into German, French and Spanish, one
prompt per sentence), after one warm-up prompt. Reported per system: wall-clock seconds for all prompts,
new tokens, tokens per second, tokens per main-model call, speedup against Tandem plain, the share of prompts
whose tokens equal Tandem plain's and transformers' plain output, and ROUGE-L of its text against Tandem
plain's. ``peers`` adds CPU peers' rows on the same prompts (``quality.peers_text``: llama.cpp on the GGUF
files, plain, with the 0.5B draft and with prompt lookup).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from ..engine import DecodeOptions, PolicyOptions, rules_from_generation_config
from ..models.pairs import engine_for
from .evaluation import take

SETS = {"summarize": "summarize-own", "translate": "translate-udhr"}
TARGETS = ("deu", "fra", "spa")  # translate-udhr: English into these
MAX_WORDS = 60  # translate-udhr paragraphs longer than this are left out (the preamble is 320 words)
DRAFTS = ("model", "prompt-lookup", "model+prompt-lookup")


@dataclass(frozen=True)
class TextBenchRow:
    task: str
    system: str
    seconds: float  # wall-clock for every prompt, one after another
    tokens: int  # new tokens, the closing eos left out
    tokens_per_s: float  # tokens / seconds
    tokens_per_call: float | None  # new tokens per main-model forward call (Tandem only)
    speedup: float  # Tandem plain's seconds / this system's seconds
    identical_to_plain: float  # share of prompts with Tandem plain's tokens
    identical_to_generate: float | None  # share of prompts with transformers' plain greedy tokens (None: no such row)
    rouge_l_to_plain: float  # ROUGE-L F of the decoded text against Tandem plain's, averaged over prompts (0-1)


def bench_prompts(runner, task: str, limit: int) -> list[list[int]]:
    """The chat prompts of ``limit`` items of the task's set (see the module docstring)."""
    from ..languages import code_in
    from ..text import TextOptions
    from .sets import build_set, read_manifest

    build_set(SETS[task])
    items = read_manifest(SETS[task])
    if task == "summarize":
        return [p for item in take(items, limit) for p in runner.chat_prompts(task, item["input"])]
    short = [i for i in items if len(i["input"].split()) <= MAX_WORDS]
    prompts = []
    for item in take(short, limit, TARGETS):
        options = TextOptions(src=code_in(item["source_lang"], runner.pair.languages),
                              tgt=code_in(item["target_lang"], runner.pair.languages))
        prompts += runner.chat_prompts(task, item["input"], options)
    return prompts


def _strip(tokens: list[int], eos: tuple[int, ...]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in eos else tokens


def _run_generate(model, prompts: list[list[int]], max_new: int, assistant=None) -> tuple[list[list[int]], float]:
    outs, t0 = [], time.perf_counter()
    for p in prompts:
        ids = torch.tensor([p], device=model.device)
        kwargs = {"assistant_model": assistant} if assistant is not None else {}
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                             max_new_tokens=max_new, **kwargs)
        outs.append(out[0, len(p):].tolist())
    return outs, time.perf_counter() - t0


def _run_engine(engine, gen, prompts: list[list[int]], max_new: int) -> tuple[list[list[int]], float, float]:
    outs, calls, t0 = [], 0, time.perf_counter()
    for p in prompts:
        rules = rules_from_generation_config(gen, len(p), max_new)
        result = engine.generate([p], rules, DecodeOptions(max_new_tokens=max_new, policy=PolicyOptions()))
        outs.append(list(result.tokens[0]))
        calls += result.stats.main_calls
    return outs, time.perf_counter() - t0, sum(map(len, outs)) / max(calls, 1)


def bench_text(task: str, pair_name: str | None = None, limit: int = 4, max_new_tokens: int = 256,
               json_path: str | None = None, models: str | None = None, log=print,
               device: str = "cpu", dtype: str | None = None, peers: tuple[str, ...] = ()) -> list[TextBenchRow]:
    """Run the systems on ``limit`` items of the task's set, the pair loaded on ``device`` in ``dtype`` (default:
    its dtype on a CPU, half precision on CUDA: ``devices.resolve_dtype``; int8/int4: quantized weights), and
    print (and write) the table. ``peers``: ``peers.TEXT_PEERS`` names whose rows follow Tandem's (model
    load not timed; one line instead where a peer cannot run here).
    Raises ``RegistryError`` / ``ModelUnavailableError`` when the pair cannot be had."""
    from ..models.registry import load_registry
    from ..text import TextRunner
    from .bench import environment, write_report
    from .metrics import rouge
    from .peers_text import text_peer_systems

    registry = load_registry(models)
    pair = registry.get(pair_name) if pair_name else registry.default(task)
    runner = TextRunner(pair, dtype, device=device)
    loaded, gen = runner.loaded, runner.model.generation_config
    eos = rules_from_generation_config(gen, 1, 1).eos
    prompts = bench_prompts(runner, task, limit)
    log(f"bench text: {task}, pair {pair.name} ({loaded.dtype} on {device}), {len(prompts)} prompts, batch 1")
    warm = min(prompts, key=len)
    systems = {"transformers generate": lambda ps: _run_generate(runner.model, ps, max_new_tokens) + (None,),
               "transformers assisted": lambda ps: _run_generate(runner.model, ps, max_new_tokens,
                                                                 loaded.assistant_model) + (None,),
               "tandem plain": lambda ps: _run_engine(loaded.plain, gen, ps, max_new_tokens)}
    drafts = DRAFTS
    if loaded.assistant_model is None:  # e.g. the prompt-lookup pair: the model systems have nothing to run
        log(f"  pair {pair.name} has no assistant: transformers assisted and Tandem's model drafters left out")
        del systems["transformers assisted"]
        drafts = tuple(d for d in DRAFTS if not d.startswith("model"))
    if not hasattr(runner.model, "generate"):  # q4_k_m: the main model is the GGUF file on llama.cpp
        log(f"  {loaded.dtype}: the main model runs on llama.cpp, not transformers: the transformers rows left out "
            "(--peers llamacpp gives llama.cpp's own plain decoding of the same file)")
        systems = {k: v for k, v in systems.items() if not k.startswith("transformers")}
    for draft in drafts:
        engine = engine_for(loaded, draft)
        systems[f"tandem {draft}"] = lambda ps, e=engine: _run_engine(e, gen, ps, max_new_tokens)
    context = max(map(len, prompts)) + max_new_tokens + 32  # + a draft round past the last token
    systems.update(text_peer_systems(peers, pair, context, max_new_tokens, eos, torch.get_num_threads(), log))
    results = {}
    for name, run in systems.items():
        run([warm])  # warm-up: lazy imports, first-call allocations, the adaptive policy's cost estimates
        outs, seconds, per_call = run(prompts)
        results[name] = ([_strip(o, eos) for o in outs], seconds, per_call)
        log(f"  {name}: {seconds:.1f} s")
    plain_outs, plain_s, _ = results["tandem plain"]
    ref_outs = results["transformers generate"][0] if "transformers generate" in results else None
    plain_texts = [runner.tok.decode(o, skip_special_tokens=True) for o in plain_outs]
    rows = []
    for name, (o, s, pc) in results.items():
        texts = [runner.tok.decode(t, skip_special_tokens=True) for t in o]
        rows.append(TextBenchRow(task, name, round(s, 2), sum(map(len, o)), round(sum(map(len, o)) / s, 1),
                                 None if pc is None else round(pc, 2), round(plain_s / s, 2),
                                 sum(a == b for a, b in zip(o, plain_outs)) / len(o),
                                 None if ref_outs is None else sum(a == b for a, b in zip(o, ref_outs)) / len(o),
                                 round(rouge(texts, plain_texts)["rougeL"].value, 4)))
    log(f"{'system':<30}{'seconds':>9}{'tokens':>8}{'tok/s':>7}{'tok/call':>9}{'speedup':>9}{'same as plain':>15}"
        f"{'same as generate':>18}{'ROUGE-L to plain':>18}")
    for r in rows:
        per_call = f"{r.tokens_per_call:.2f}" if r.tokens_per_call is not None else "-"
        same = "-" if r.identical_to_generate is None else f"{r.identical_to_generate:.0%}"
        log(f"{r.system:<30}{r.seconds:>9.1f}{r.tokens:>8}{r.tokens_per_s:>7.1f}{per_call:>9}{r.speedup:>8.2f}x"
            f"{r.identical_to_plain:>15.0%}{same:>18}{100 * r.rouge_l_to_plain:>18.1f}")
    write_report({"environment": environment(device), "pair": pair.name, "task": task, "prompts": len(prompts),
                  "rows": [asdict(r) for r in rows]}, json_path, log)
    return rows
