"""The ``tandem bench`` subcommands' parsers: one ``add_bench_<name>`` each (``parser.build_parser`` adds them
through ``add_bench``; the shared types and options are in ``arguments``)."""

from __future__ import annotations

from ..devices import TORCH_WEIGHT_DTYPES, WEIGHT_DTYPES
from ..errors import TandemError
from ..quality.peers import ASR_PEERS, TEXT_PEERS, parse_peers
from .arguments import (
    DTYPES,
    WEIGHT_DTYPE_HELP,
    add_alias,
    add_command,
    add_dtype,
    add_model,
    add_report,
    argument_type,
    count,
)
from .commands import cmd_bench_asr, cmd_bench_engine, cmd_bench_scale, cmd_bench_shapes, cmd_bench_text

SPEECH_SETS = "speech-real,speech-synth,speech-long"
TEXT_BENCH_SETS = ("summarize-own", "translate-udhr")  # bench text's sets (quality.bench_text.SETS)


def add_peers(b, known: tuple[str, ...], what: str) -> None:
    """``--peers NAME[,NAME...]``: other engines' rows beside Tandem's (``quality.peers``)."""
    parse = argument_type(lambda text: parse_peers(text, known), errors=(TandemError,))
    b.add_argument("--peers", type=parse, default=(), metavar=",".join(known),
                   help=f"CPU peers also run, comma-separated: {what} (the 'bench-peers' extra; a peer that cannot "
                        "run here prints its reason instead of a row)")


def _dtype_names(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names or any(n not in DTYPES + TORCH_WEIGHT_DTYPES for n in names):
        raise ValueError(text)
    return names


# an argparse type: comma-separated dtypes a Whisper pair runs in (the float ones, int8, int4)
dtype_list = argument_type(_dtype_names, f"expected comma-separated dtypes of {', '.join(DTYPES + TORCH_WEIGHT_DTYPES)}")


def add_bench(sub) -> None:
    p = add_command(sub, "bench", help="side-by-side speed benchmarks (tables + JSON)")
    bench_sub = p.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    for add in (add_bench_engine, add_bench_asr, add_bench_shapes, add_bench_text, add_bench_scale, add_bench_serve):
        add(bench_sub)


def add_bench_engine(sub) -> None:
    b = add_command(sub, "engine", help="transformers plain/assisted vs Tandem plain/assisted/batched, same inputs")
    b.add_argument("--limit", type=count, default=24, help="speech inputs (speech-real, then speech-synth)")
    add_report(b, "reports/bench-engine.json")
    b.add_argument("--no-toys", action="store_true", help="skip the random-weight BART and Llama pairs")
    b.add_argument("--end-to-end", action="store_true", help="time the encoder too (default: decode only, encoder "
                   "output shared)")
    add_dtype(b, "Whisper pairs' dtype (default: float32 on a CPU, bfloat16 on CUDA)")
    b.set_defaults(func=cmd_bench_engine)


def add_bench_asr(sub) -> None:
    b = add_command(sub, "asr", help="faster-whisper, transformers, Tandem plain/assisted in each of --dtypes, same files")
    add_model(b, "asr pair", default="whisper-base")
    b.add_argument("--dtypes", type=dtype_list, default=("float32", "bfloat16"), metavar="DTYPE[,DTYPE...]",
                   help="the transformers and Tandem rows' dtypes, side by side (speed-ups against transformers plain "
                        "in the first): float32, bfloat16, float16, int8, int4 (int8 / int4: as transcribe's --dtype)")
    b.add_argument("--set", "--sets", dest="sets", default=SPEECH_SETS, metavar="SET[,SET...]",
                   help="comma-separated evaluation sets")
    b.add_argument("--limit", type=count, default=60, help="files per set at most")
    b.add_argument("--batch-size", type=count, default=8, help="Tandem's files per batch")
    b.add_argument("--chunk-batch", type=count, default=8,
                   help="sets with files over 30 s: chunks per batch of the chunked long-form rows, Tandem's and "
                        "faster-whisper's batched pipeline")
    add_report(b, "reports/bench-asr.json")
    b.add_argument("--also", nargs="+", default=(), metavar="PAIR", help="other pairs with the same main model (another "
                   "assistant): their Tandem assisted rows beside the pair's, in the same run")
    add_peers(b, ASR_PEERS, "whispercpp (whisper.cpp on the main model converted to ggml f16 and q8_0), openvino")
    b.set_defaults(func=cmd_bench_asr)


def add_bench_shapes(sub) -> None:
    b = add_command(sub, "shapes", help="assisted decoding's speed-up against acceptance at a model's real shapes "
                    "(random weights, an oracle drafter of fixed acceptance), against transformers generate and "
                    "Tandem plain")
    b.add_argument("--shape", choices=["whisper-base", "whisper-large-v3"], default="whisper-base",
                   help="decoder shape: layers, d_model, heads, vocabulary")
    b.add_argument("--tokens", type=count, default=64, help="new tokens per row")
    b.add_argument("--rows", type=count, default=1, help="rows decoded together")
    b.add_argument("--acceptance", default="0.6,0.8,0.9", help="the oracle's per-token acceptance, comma-separated")
    b.add_argument("--lookahead", default="3", help="drafts per round, constant; comma-separated: one assisted row "
                   "per lookahead and acceptance; --step-costs: the verify pass's drafts, the first")
    b.add_argument("--width", type=int, help="the main decoder's pass width, plain and assisted alike (default: the "
                   "device's: 8 on CUDA, by CPU and dtype on a CPU)")
    b.add_argument("--assistant-layers", type=count, default=2, help="decoder layers of the assistant")
    b.add_argument("--beam-size", type=count, help="beam search, N beams a row (whisper's semantics): plain beam "
                   "search's tree known to the oracle, each drafted step right for every beam with the acceptance's "
                   "probability; transformers generate with num_beams N")
    add_dtype(b, "(default: float32 on a CPU, bfloat16 on CUDA)")
    b.add_argument("--step-costs", action="store_true", help="instead: the wall time of one main step, one verify "
                   "pass and one draft step, eager and (CUDA) on the graph fast path, beside their kernel time "
                   "(torch.profiler)")
    add_report(b, "reports/bench-shapes.json")
    b.set_defaults(func=cmd_bench_shapes)


def add_bench_text(sub) -> None:
    b = add_command(sub, "text", help="transformers plain/assisted vs Tandem plain and each drafter, same chat "
                    "prompts, batch 1")
    b.add_argument("--set", choices=TEXT_BENCH_SETS, default="summarize-own", help="the text set benchmarked "
                   "(its task: summarize or translate)")
    add_alias(b, "--task", dest="task", choices=("summarize", "translate"))  # older spelling: the set's task
    add_model(b, "text pair from the registry (default: the task's default, the embedded Qwen pair)")
    b.add_argument("--limit", type=count, default=4, help="items of the set")
    b.add_argument("--max-new-tokens", type=count, default=256, help="per prompt")
    add_dtype(b, WEIGHT_DTYPE_HELP, weights=WEIGHT_DTYPES)
    add_peers(b, TEXT_PEERS, "llamacpp (llama.cpp on the pair's GGUF files: plain, the 0.5B draft, prompt lookup), "
              "openvino")
    add_report(b, "reports/bench-text.json")
    b.set_defaults(func=cmd_bench_text)


def add_bench_serve(sub) -> None:
    from ..serve.bench import cmd_bench_serve, parse_counts

    counts = argument_type(parse_counts, "whole numbers from 1, comma-separated")
    b = add_command(sub, "serve", help="tandem serve under N concurrent openai clients: requests/s, audio s per wall "
                    "s, p50/p95 latency; batched vs one at a time, with and without the assistant (the 'serve' extra)")
    add_model(b, "asr pair (default: the registry's asr default)")
    b.add_argument("--set", "--sets", dest="sets", default="speech-real", metavar="SET[,SET...]",
                   help="comma-separated evaluation sets whose files the clients send")
    b.add_argument("--limit", type=count, default=16, help="files per set at most (each sent once per row)")
    b.add_argument("--clients", type=counts, default="1,4,16", metavar="N[,N...]",
                   help="concurrent clients, comma-separated: one row each per configuration")
    b.add_argument("--max-batch", type=count, default=16, metavar="N", help="the batched server's rows (the other "
                   "serves one request at a time)")
    add_report(b, "reports/bench-serve.json")
    b.set_defaults(func=cmd_bench_serve)


def add_bench_scale(sub) -> None:
    b = add_command(sub, "scale", help="the batch job in-process (1 thread, every core) vs on a local Ray actor "
                    "pool: files per minute, Ray's start-up (needs the 'scale' extra)")
    add_model(b, "asr pair (default: the registry's asr default)")
    b.add_argument("--set", default="speech-real", help="evaluation set")
    b.add_argument("--limit", type=count, default=12, help="files at most")
    b.add_argument("--batch-size", type=count, default=4, help="windows decoded together")
    b.add_argument("--actor-counts", "--actors", dest="actors", default="1,2", metavar="N[,N...]",
                   help="comma-separated actor counts, one Ray row each")
    b.add_argument("--threads-per-actor", type=count, default=1, help="torch threads per actor")
    add_report(b, "reports/bench-scale.json")
    b.set_defaults(func=cmd_bench_scale)
