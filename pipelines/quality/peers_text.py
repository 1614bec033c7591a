"""The benchmarks' CPU peers for text: llama.cpp (through llama-cpp-python) and OpenVINO GenAI's LLMPipeline beside
``tandem bench text --peers``, on the same chat prompts (token ids, no re-templating), greedy, batch 1, with
torch's thread count. llama.cpp runs on the very GGUF files Tandem ships for the Qwen pair (Q4_K_M, joined once
into the cache as ``models/<name>-gguf/model.gguf``).

Systems: llama.cpp plain; llama.cpp with the 0.5B GGUF as draft model (``LlamaModelDraft``: the binding's
``draft_model`` hook fed by a second ``Llama``, ``DRAFT_TOKENS`` greedy tokens a round); llama.cpp with the
binding's own prompt lookup (``LlamaPromptLookupDecoding`` at its defaults). Each prompt starts from an
empty KV cache (``Llama.reset``), as Tandem's do: no prefix is reused across prompts. Model load is not timed.

OpenVINO runs on IR exported from the pair's transformers folders (``peers.ov_ir_folder``) in int8 and int4
weights, fed the token ids as ``TokenizedInputs``, each ``generate`` from a fresh KV cache (its scheduler's
prefix caching, on by default, switched off): plain, and with the 0.5B IR in the same format as ``draft_model``
(``DRAFT_TOKENS`` a round).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .peers import EXTRA, OV_TEXT_TASK, PeerUnavailable, each_precision, gather_peers, ov_ir_folder, ov_pipeline

DRAFT_TOKENS = 4  # the draft's tokens a round (issue 59: llama-speculative was faster at draft max 4 than at 16)
DRAFT_FOR = {"qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-0.5b-instruct"}  # when the pair names no assistant
Generator = Callable[[list[list[int]]], tuple[list[list[int]], float, None]]  # prompts -> (tokens, seconds, None)
GREEDY = dict(temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
OPENVINO_TEXT_FORMATS = ("int8", "int4")  # optimum-cli's --weight-format (what OpenVINO GenAI's users run)


def joined_gguf(name: str) -> Path:
    """The GGUF file of embedded text model ``name`` (``models.llamacpp.gguf_file``: its registry parts joined once
    into the cache, size and sha256 checked). Raises ``PeerUnavailable`` when ``name`` is not one."""
    from ..models.embedded_gguf import GGUF
    from ..models.llamacpp import gguf_file
    from ..models.loading import ModelRef

    if name not in GGUF:
        raise PeerUnavailable(f"{name} is not a GGUF model Tandem ships: llama.cpp reads those only")
    return gguf_file(ModelRef("embedded", name))


def _greedy(llm, prompt: list[int], limit: int, stop: tuple[int, ...]) -> list[int]:
    """Up to ``limit`` greedy tokens after ``prompt`` from the KV cache ``llm`` holds (a stop token ends it and
    is kept, as Tandem's outputs keep their eos)."""
    out: list[int] = []
    for token in llm.generate(prompt, reset=True, **GREEDY):
        out.append(token)
        if token in stop or len(out) == limit:
            break
    return out


def _draft_class():
    from llama_cpp.llama_speculative import LlamaDraftModel

    class LlamaModelDraft(LlamaDraftModel):
        """A draft model for the binding's ``draft_model`` hook: ``tokens`` greedy tokens of a second ``Llama``
        after the main model's context (its own KV cache reused across rounds by prefix match)."""

        def __init__(self, llm, tokens: int):
            self.llm, self.tokens = llm, tokens

        def __call__(self, input_ids, /, **kwargs):
            return np.array(_greedy(self.llm, input_ids.tolist(), self.tokens, ()), dtype=np.intc)

    return LlamaModelDraft


def _generator(llm, max_new: int, eos: tuple[int, ...], draft=None) -> Generator:
    def run(prompts: list[list[int]]):
        outs, start = [], time.perf_counter()
        for p in prompts:
            llm.reset()
            if draft is not None:
                draft.llm.reset()
            outs.append(_greedy(llm, p, max_new, eos))
        return outs, time.perf_counter() - start, None

    return run


def llamacpp_systems(pair, context: int, max_new: int, eos: tuple[int, ...], threads: int,
                     log=print) -> dict[str, Generator]:
    """``{"llama.cpp plain": run, "llama.cpp model draft": run, "llama.cpp prompt lookup": run}`` for ``pair`` (its main
    an embedded GGUF; the draft its assistant, or ``DRAFT_FOR``'s), each ``Llama`` with a context of ``context``
    tokens and ``threads`` threads. Raises ``PeerUnavailable`` without llama-cpp-python or a GGUF main model."""
    try:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        raise PeerUnavailable(f"llama-cpp-python is not installed ({EXTRA})") from None
    if pair.main.source != "embedded":
        raise PeerUnavailable(f"the pair's main model is {pair.main}, not a GGUF file Tandem ships")
    main = joined_gguf(pair.main.id)

    def load(path: Path, **extra):
        return Llama(model_path=str(path), n_ctx=context, n_batch=512, n_threads=threads, n_threads_batch=threads,
                     verbose=False, **extra)

    systems = {"llama.cpp plain": _generator(load(main), max_new, eos)}
    try:
        draft = _draft_class()(load(joined_gguf(draft_name(pair))), DRAFT_TOKENS)
        systems["llama.cpp model draft"] = _generator(load(main, draft_model=draft), max_new, eos, draft)
    except PeerUnavailable as err:
        log(f"llama.cpp with a draft model: no row: {err}")
    systems["llama.cpp prompt lookup"] = _generator(load(main, draft_model=LlamaPromptLookupDecoding()), max_new, eos)
    return systems


def draft_name(pair) -> str:
    """The draft model of ``pair`` for the peers: its embedded assistant, else ``DRAFT_FOR``'s. Raises
    ``PeerUnavailable`` when there is none."""
    if pair.assistant and pair.assistant.source == "embedded":
        return pair.assistant.id
    if pair.main.id not in DRAFT_FOR:
        raise PeerUnavailable(f"no embedded draft model known for {pair.main.id}")
    return DRAFT_FOR[pair.main.id]


def _ov_generator(pipe, config) -> Generator:
    """``pipe.generate`` on each prompt's token ids, one at a time (batch 1)."""
    import openvino as ov
    import openvino_genai

    def run(prompts: list[list[int]]):
        outs, start = [], time.perf_counter()
        for p in prompts:
            ids = np.array([p], dtype=np.int64)
            inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
            outs.append(list(pipe.generate(inputs, config).tokens[0]))
        return outs, time.perf_counter() - start, None

    return run


def openvino_text_systems(pair, max_new: int, eos: tuple[int, ...], threads: int, log=print) -> dict[str, Generator]:
    """``{"OpenVINO <f> plain": run, "OpenVINO <f> model draft": run}`` for each format ``f`` of
    ``OPENVINO_TEXT_FORMATS``: ``openvino_genai.LLMPipeline`` on the IR of ``pair``'s main model (an embedded text
    model, ``peers.ov_ir_folder``), alone and with the draft's IR in the same format as ``draft_model``, on the
    CPU with ``threads`` inference threads; greedy, up to ``max_new`` tokens, ``eos`` stops. Raises
    ``PeerUnavailable`` without openvino-genai or an embedded main model, or when its first format cannot be
    exported (a later format, or a draft that cannot be had, is logged and left out)."""
    from ..models.embedded import embedded_path
    from ..models.embedded_gguf import GGUF

    try:
        import openvino_genai
    except ImportError:
        raise PeerUnavailable(f"openvino-genai is not installed ({EXTRA})") from None
    if pair.main.source != "embedded" or pair.main.id not in GGUF:
        raise PeerUnavailable(f"the pair's main model is {pair.main}, not an embedded text model to export")

    def ir(name: str, weight_format: str) -> Path:
        return ov_ir_folder(name, embedded_path(name), GGUF[name].sha256, OV_TEXT_TASK, weight_format, log)

    def config(draft_tokens: int = 0):
        # a fresh config: greedy, no repetition penalty (not the model's sampling defaults); eos ids stop
        c = openvino_genai.GenerationConfig()
        c.max_new_tokens, c.do_sample, c.stop_token_ids = max_new, False, set(eos)
        if draft_tokens:
            c.num_assistant_tokens = draft_tokens
        return c

    def fresh_cache() -> dict:
        # its scheduler keeps earlier prompts' KV blocks by default (prefix caching): off, so each prompt is
        # computed whole, as Tandem's and llama.cpp's are
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.enable_prefix_caching = False
        return {"scheduler_config": scheduler, "INFERENCE_NUM_THREADS": threads}

    def load(weight_format: str) -> dict[str, Generator]:
        main, name = str(ir(pair.main.id, weight_format)), f"OpenVINO {weight_format}"
        plain = ov_pipeline(f"{pair.main.id} {weight_format}",
                            lambda: openvino_genai.LLMPipeline(main, "CPU", **fresh_cache()))
        systems = {f"{name} plain": _ov_generator(plain, config())}
        try:
            draft = str(ir(draft_name(pair), weight_format))
            assisted = ov_pipeline(f"{pair.main.id} {weight_format} with its draft", lambda: openvino_genai.LLMPipeline(
                main, "CPU", draft_model=openvino_genai.draft_model(draft, "CPU", INFERENCE_NUM_THREADS=threads),
                **fresh_cache()))
            systems[f"{name} model draft"] = _ov_generator(assisted, config(DRAFT_TOKENS))
        except PeerUnavailable as err:
            log(f"{name} with a draft model: no row: {err}")
        return systems

    return each_precision("OpenVINO", OPENVINO_TEXT_FORMATS, load, log)


def text_peer_systems(peers: tuple[str, ...], pair, context: int, max_new: int, eos: tuple[int, ...], threads: int,
                      log=print) -> dict[str, Generator]:
    """The text peers' systems (name -> run over prompts), loaded (``peers.gather_peers``)."""
    return gather_peers(peers, {"llamacpp": lambda: llamacpp_systems(pair, context, max_new, eos, threads, log),
                                "openvino": lambda: openvino_text_systems(pair, max_new, eos, threads, log)}, log)
