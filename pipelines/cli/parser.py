"""The ``tandem`` argument parser: every command and its options (``--help`` is generated from here)."""

from __future__ import annotations

import argparse

from .. import __version__
from .commands import (
    cmd_bench_asr,
    cmd_bench_engine,
    cmd_bench_scale,
    cmd_bench_shapes,
    cmd_bench_text,
    cmd_data_build,
    cmd_data_list,
    cmd_demo,
    cmd_distill,
    cmd_eval,
    cmd_models,
    cmd_regress,
    cmd_text,
    cmd_transcribe,
    cmd_ui,
)


def _whole_number(low: int, high: int | None = None):
    """An argparse type: a whole number from ``low`` (to ``high``), else an argument error saying the range."""
    bounds = f"from {low}" + (f" to {high}" if high is not None else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or high is not None and value > high:
            raise argparse.ArgumentTypeError(f"expected a whole number {bounds}, not {text!r}")
        return value

    return parse


_count = _whole_number(1)  # a count (items, repeats, rows, tokens, threads, a batch)
_port = _whole_number(1, 65535)  # a TCP port


def _positive(text: str) -> float:
    """A positive number from the command line (epochs, a learning rate, minutes)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number above 0, not {text!r}")
    return value


def _threshold(text: str) -> float | None:
    """A threshold from the command line: a number, or 'off' (None: the check is off)."""
    if text.lower() in ("off", "none"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'off', not {text!r}") from None


def _temperatures(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, not {text!r}") from None


DEVICE_HELP = ("where the models run: auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N "
               "(default: $TANDEM_DEVICE, else auto); on CUDA the dtype defaults to bfloat16 (float16 where "
               "bfloat16 is not supported)")
DEVICE_PARENT = argparse.ArgumentParser(add_help=False)
DEVICE_PARENT.add_argument("--device", metavar="DEVICE", default=argparse.SUPPRESS, help=DEVICE_HELP)


def command(subparsers, name: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand; it takes --device after its name too (tandem transcribe --device cuda = tandem --device
    cuda transcribe; given after the name, it wins)."""
    return subparsers.add_parser(name, parents=[DEVICE_PARENT], **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem",
        description="Faster speech recognition, translation and summarization with assisted decoding, same output.",
    )
    parser.add_argument("--version", action="version", version=f"tandem {__version__}")
    parser.add_argument("--models", metavar="FILE", help="pair registry to use (default: the project's models.yaml, or $TANDEM_MODELS)")
    parser.add_argument("--threads", type=_count, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", metavar="DEVICE", default=None, help=DEVICE_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    p = command(sub, "models", help="list every pair: task, weights, offline availability, pre-flight verdict")
    p.add_argument("--all", action="store_true", help="include test-only pairs")
    p.add_argument("--online", action="store_true", help="fetch configs and tokenizers of hub models for the pre-flight")
    p.set_defaults(func=cmd_models)

    p = command(sub, "data", help="build and list the offline evaluation sets")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    b = command(data_sub, "build", help="build sets (all when none is named); a second run does nothing")
    b.add_argument("sets", nargs="*", metavar="SET", help="speech-real, speech-synth, speech-long, translate-udhr, summarize-own, summarize-debian")
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    b.set_defaults(func=cmd_data_build)
    ls = command(data_sub, "list", help="which sets are built, and where")
    ls.set_defaults(func=cmd_data_list)

    p = command(sub, "transcribe", help="transcribe audio or video files, folders (recursive) or globs")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--pair", help="asr pair from the registry (default: the registry's asr default)")
    p.add_argument("--language", default="en", help="language code, or 'auto' to detect per file (default: en); "
                   "English-only (.en) pairs take en or auto only")
    p.add_argument("--task", choices=["transcribe", "translate"], default="transcribe",
                   help="Whisper's task: transcribe in the spoken language, or translate into English (default: %(default)s)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="compute dtype (default: the pair's)")
    p.add_argument("--refs", metavar="MANIFEST", help="a manifest.jsonl with reference texts: prints WER")
    p.add_argument("--out", metavar="DIR", help="write outputs here (mirroring the input folders), resumable")
    p.add_argument("--formats", default="txt", help="comma-separated: txt,json,srt,vtt,tsv (default: txt)")
    p.add_argument("--batch-size", type=_count, default=4,
                   help="windows decoded together: of different files, or with --long-form chunked also chunks of one file (default: 4)")
    p.add_argument("--long-form", choices=["sequential", "chunked"], default="sequential",
                   help="files over 30 s: window after window as Whisper seeks (default), or cut at pauses into "
                        "chunks of 15-26 s decoded several at a time (faster in batches; wording may differ at chunk edges)")
    p.add_argument("--timestamps", action="store_true", help="timestamp tokens even for clips under 30 s (on for srt/vtt/tsv)")
    p.add_argument("--no-assistant", action="store_true", help="plain decoding with the pair's main model")
    p.add_argument("--compare", action="store_true", help="also decode plainly: speedup and identical-output rate")
    p.add_argument("--lookahead", default="adaptive", metavar="POLICY[:N]",
                   help="drafts per round: adaptive (default), constant:N, heuristic:N, confidence, random:SEED "
                        "(a seeded random schedule, to check that outputs do not depend on it)")
    p.add_argument("--temperature", type=_temperatures, default=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), metavar="T[,T...]",
                   help="Whisper's temperature fallback: the first decodes greedily, each retry samples at the next "
                        "(assisted, exact speculative sampling) (default: 0,0.2,0.4,0.6,0.8,1.0; 0 alone: no fallback)")
    p.add_argument("--compression-ratio-threshold", type=_threshold, default=2.4, metavar="X",
                   help="fall back when the text's gzip compression ratio is above X (default: 2.4; 'off')")
    p.add_argument("--logprob-threshold", type=_threshold, default=-1.0, metavar="X",
                   help="fall back when the average log-probability is below X (default: -1.0; 'off')")
    p.add_argument("--no-speech-threshold", type=_threshold, default=0.6, metavar="P",
                   help="skip a window as silence when p(no speech) is above P and the average log-probability is "
                        "below --logprob-threshold (default: 0.6; 'off')")
    p.add_argument("--vad-filter", action=argparse.BooleanOptionalAction, default=False,
                   help="Silero voice-activity filter before decoding (faster-whisper's model; pip install -e "
                        "'.[vad]'): audio outside speech is not decoded, timestamps stay the file's (default: off)")
    p.add_argument("--ray", nargs="?", const="auto", metavar="auto|local|ADDRESS",
                   help="decode on a Ray actor pool (needs pip install -e '.[scale]'): auto (the cluster this machine "
                        "belongs to or $RAY_ADDRESS, else a local one; the default when --ray has no value), local (a "
                        "new local one), or a cluster's ADDRESS (host:6379 or ray://host:10001)")
    p.add_argument("--actors", type=_count, default=None, metavar="N",
                   help="with --ray: decoding actors, each loading the pair once (default: one per GPU, else one "
                        "per --threads-per-actor CPUs of the cluster)")
    p.add_argument("--threads-per-actor", type=_count, default=1, metavar="N",
                   help="with --ray: torch threads (and CPUs reserved) per actor (default: 1)")
    p.add_argument("--files-per-task", type=_count, default=None, metavar="N",
                   help="with --ray: files handed to an actor at a time, the most a dying actor costs "
                        "(default: --batch-size)")
    p.set_defaults(func=cmd_transcribe)

    for task, helptext in (("translate", "translate text (sentences batched through the engine)"),
                           ("summarize", "summarize text (chunked when longer than the model's input)")):
        p = command(sub, task, help=helptext)
        p.add_argument("text", nargs="*", metavar="TEXT", help="texts ('-' or none: standard input; or --file)")
        p.add_argument("--file", action="append", metavar="FILE", help="read a text from FILE (repeatable)")
        p.add_argument("--pair", help=f"{task} pair from the registry (default: the registry's {task} default)")
        if task == "translate":
            p.add_argument("--src", help="source language, as the pair lists it (the embedded Qwen pair: en, de, fr, ...; NLLB: eng_Latn)")
            p.add_argument("--tgt", help="target language, as the pair lists it (e.g. de; NLLB: deu_Latn)")
        else:
            p.add_argument("--long-input", choices=["chunk", "truncate"], default="chunk",
                           help="text longer than the model's input: summarise in chunks (default) or truncate")
        p.add_argument("--max-new-tokens", type=_count, help="per sentence/chunk (default: the model's)")
        p.add_argument("--batch-size", type=_count, default=8, help="inputs decoded together (default: %(default)s)")
        p.add_argument("--no-assistant", action="store_true", help="plain decoding with the main model")
        p.add_argument("--compare", action="store_true", help="also decode plainly: speedup and identical outputs")
        p.add_argument("--refs", action="append", metavar="FILE", help="reference text per input: BLEU/chrF or ROUGE")
        p.set_defaults(func=cmd_text)

    p = command(sub, "eval", help="quality and latency of plain vs assisted decoding for one pair and set (JSON)")
    p.add_argument("--task", required=True, choices=["asr", "translate", "summarize"], help="the task evaluated")
    p.add_argument("--pair", required=True, help="pair from the registry")
    p.add_argument("--set", required=True, help="evaluation set (tandem data build SET)")
    p.add_argument("--limit", type=_count, help="first N items only")
    p.add_argument("--repeats", type=_count, default=3, help="interleaved timed runs per mode (default: 3)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="compute dtype (default: the pair's)")
    p.add_argument("--json", metavar="FILE", help="write the report (schema tandem-eval/1) here")
    p.add_argument("--lookahead", default="adaptive", metavar="POLICY[:N]",
                   help="drafts per round: adaptive (default), constant:N, heuristic:N, confidence, random:SEED")
    p.set_defaults(func=cmd_eval)

    p = command(sub, "bench", help="side-by-side speed benchmarks (tables + JSON)")
    bench_sub = p.add_subparsers(dest="bench_command", required=True)
    b = command(bench_sub, "engine", help="transformers plain/assisted vs Tandem plain/assisted/batched, same inputs")
    b.add_argument("--limit", type=_count, default=24, help="speech inputs (speech-real, then speech-synth) (default: 24)")
    b.add_argument("--json", default="reports/bench-engine.json", help="where to write the figures (default: %(default)s)")
    b.add_argument("--no-toys", action="store_true", help="skip the random-weight BART and Llama pairs")
    b.add_argument("--end-to-end", action="store_true", help="time the encoder too (default: decode only, encoder output shared)")
    b.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="Whisper pairs' dtype (default: float32 on a CPU, bfloat16 on CUDA)")
    b.set_defaults(func=cmd_bench_engine)
    b = command(bench_sub, "asr", help="faster-whisper, transformers, Tandem plain/assisted in float32 and bfloat16, same files")
    b.add_argument("--pair", default="whisper-base", help="asr pair (default: %(default)s)")
    b.add_argument("--sets", default="speech-real,speech-synth,speech-long", help="comma-separated sets (default: %(default)s)")
    b.add_argument("--limit", type=_count, default=60, help="files per set at most (default: %(default)s)")
    b.add_argument("--batch-size", type=_count, default=8, help="Tandem's files per batch (default: %(default)s)")
    b.add_argument("--chunk-batch", type=_count, default=8,
                   help="sets with files over 30 s: chunks per batch of the chunked long-form rows, Tandem's and "
                        "faster-whisper's batched pipeline (default: %(default)s)")
    b.add_argument("--json", default="reports/bench-asr.json", help="where to write the figures (default: %(default)s)")
    b.add_argument("--also", nargs="+", default=(), metavar="PAIR", help="other pairs with the same main model (another "
                   "assistant): their Tandem assisted rows beside the pair's, in the same run")
    b.set_defaults(func=cmd_bench_asr)
    b = command(bench_sub, "shapes", help="assisted decoding's speed-up against acceptance at a model's real shapes (random "
                "weights, an oracle drafter of fixed acceptance), against transformers generate and Tandem plain")
    b.add_argument("--shape", choices=["whisper-base", "whisper-large-v3"], default="whisper-base",
                   help="decoder shape: layers, d_model, heads, vocabulary (default: %(default)s)")
    b.add_argument("--tokens", type=_count, default=64, help="new tokens per row (default: %(default)s)")
    b.add_argument("--rows", type=_count, default=1, help="rows decoded together (default: %(default)s)")
    b.add_argument("--acceptance", default="0.6,0.8,0.9", help="the oracle's per-token acceptance, comma-separated (default: %(default)s)")
    b.add_argument("--lookahead", default="3", help="drafts per round, constant; comma-separated: one assisted row "
                   "per lookahead and acceptance; --step-costs: the verify pass's drafts, the first (default: %(default)s)")
    b.add_argument("--width", type=int, help="the main decoder's pass width, plain and assisted alike (default: the "
                   "device's: 8 on CUDA, by CPU and dtype on a CPU)")
    b.add_argument("--assistant-layers", type=_count, default=2, help="decoder layers of the assistant (default: %(default)s)")
    b.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="(default: float32 on a CPU, bfloat16 on CUDA)")
    b.add_argument("--step-costs", action="store_true", help="instead: the wall time of one main step, one verify "
                   "pass and one draft step, eager and (CUDA) on the graph fast path, beside their kernel time (torch.profiler)")
    b.add_argument("--json", default="reports/bench-shapes.json", help="where to write the figures (default: %(default)s)")
    b.set_defaults(func=cmd_bench_shapes)
    b = command(bench_sub, "text", help="transformers plain/assisted vs Tandem plain and each drafter, same chat prompts, batch 1")
    b.add_argument("--task", choices=["summarize", "translate"], default="summarize",
                   help="the text task benchmarked (default: %(default)s)")
    b.add_argument("--pair", help="text pair from the registry (default: the task's default, the embedded Qwen pair)")
    b.add_argument("--limit", type=_count, default=4, help="items of summarize-own / translate-udhr (default: %(default)s)")
    b.add_argument("--max-new-tokens", type=_count, default=256, help="per prompt (default: %(default)s)")
    b.add_argument("--json", default="reports/bench-text.json", help="where to write the figures (default: %(default)s)")
    b.set_defaults(func=cmd_bench_text)
    b = command(bench_sub, "scale", help="the batch job in-process (1 thread, every core) vs on a local Ray actor pool: "
                                          "files per minute, Ray's start-up (needs the 'scale' extra)")
    b.add_argument("--pair", help="asr pair (default: the registry's asr default)")
    b.add_argument("--set", default="speech-real", help="evaluation set (default: %(default)s)")
    b.add_argument("--limit", type=_count, default=12, help="files at most (default: %(default)s)")
    b.add_argument("--batch-size", type=_count, default=4, help="windows decoded together (default: %(default)s)")
    b.add_argument("--actors", default="1,2", help="comma-separated actor counts, one Ray row each (default: %(default)s)")
    b.add_argument("--threads-per-actor", type=_count, default=1, help="torch threads per actor (default: %(default)s)")
    b.add_argument("--json", default="reports/bench-scale.json", help="where to write the figures (default: %(default)s)")
    b.set_defaults(func=cmd_bench_scale)

    p = command(sub, "distill", help="make a small assistant for a main model: corpus, labels from the main model, training, export")
    p.add_argument("--main", required=True, metavar="PAIR_OR_MODEL", help="a pair (its main model), an embedded name, a folder or a hub id")
    p.add_argument("--layers", type=_count, default=2, help="decoder layers of the assistant (default: %(default)s)")
    p.add_argument("--init", choices=("spread", "first"), default="spread", help="the main decoder's layers the assistant "
                   "starts from: spread (first, last and between; the default) or first (the main model's early exit)")
    p.add_argument("--drafter", choices=("student", "medusa"), default="student", help="the drafter's design: a "
                   "shallow student decoder (the default), or medusa: heads on the main decoder's hidden state (Whisper, "
                   "with --curve: measured, not exported)")
    p.add_argument("--heads", type=_count, default=5, help="--drafter medusa: draft heads (default: %(default)s)")
    p.add_argument("--data", nargs="+", metavar="SET", help="corpus: debian-speech (Whisper; the default) or text files of one input a line (text models)")
    p.add_argument("--out", required=True, metavar="DIR", help="working folder: shards, checkpoints, and the exported assistant in DIR/assistant")
    p.add_argument("--clips", type=_count, default=4000, help="training items (default 4000); items the corpus does not hold yet are labelled and added to it")
    p.add_argument("--heldout", type=int, default=96,
                   help="held-out items (shard 0; Whisper, without --curve: as many held-out fortunes too) for the agreement estimate")
    p.add_argument("--epochs", type=_positive, default=3.0,
                   help="passes over the training items (default: %(default)s; --steps instead counts optimizer steps)")
    p.add_argument("--batch-size", type=_count, default=16, help="clips per optimizer step (default: %(default)s)")
    p.add_argument("--lr", type=_positive, default=3e-4,
                   help="AdamW's peak learning rate, after a warm-up and before cosine decay (default: %(default)s)")
    p.add_argument("--draft-vocab", type=int, default=16384, help="tokens kept by the draft head (plus special tokens); 0 keeps all")
    p.add_argument("--budget-minutes", type=_positive, default=None, help="stop cleanly after this long (exit 3); --resume goes on")
    p.add_argument("--resume", action="store_true", help="go on from what DIR holds")
    p.add_argument("--corpus", metavar="DIR", help="Whisper: the labelled corpus kept in the repository, read and grown "
                   "(default: data/distill/<main model>)")
    p.add_argument("--label-only", action="store_true", help="grow the corpus to --clips training items (labels only, "
                   "no training features), then stop before training")
    p.add_argument("--curve", metavar="N,N,...", help="Whisper: the learning curve by corpus size: a student trained on "
                   "the first N clips for each N (the same steps each), measured on the held-out shard and speech-real; "
                   "the largest size's student is exported with the curve on its card")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per training (default: --epochs over the "
                   "training items; with --curve, over the largest size)")
    p.add_argument("--shards", metavar="A-B,C,...", help="Whisper: train on these shards of the corpus only (e.g. "
                   "317-360: the clips added since an assistant was trained; shards it lacks are labelled and added), "
                   "not --clips' first ones")
    p.add_argument("--start", metavar="shipped|DIR", help="Whisper: go on training an exported assistant (shipped: the "
                   "one shipped for --main; DIR: a distill run's folder or its assistant) instead of the main model's "
                   "layers; the draft vocabulary is then counted over the whole corpus")
    p.set_defaults(func=cmd_distill)

    p = command(sub, "regress", help="nightly regression run: evaluations, history (SQLite), baseline, thresholds, report with plots; exit 1 on a regression")
    p.add_argument("--config", metavar="FILE", help="regression config (default: data/nightly.yaml)")
    p.add_argument("--pin", type=int, metavar="RUN", help="compare with this run instead of the last accepted one")
    p.add_argument("--accept", type=int, metavar="RUN", help="accept a run by hand (an intended change) and exit")
    p.set_defaults(func=cmd_regress)

    p = command(sub, "ui", help="serve the Streamlit app (Translate, Summarize, Transcribe) on 127.0.0.1")
    p.add_argument("--port", type=_port, default=8501, help="the Streamlit server's port (default: %(default)s)")
    p.set_defaults(func=cmd_ui)

    p = command(sub, "demo", help="the main job on sample audio: build speech-real and transcribe it with the default "
                                  "pair, with WER, speedup over plain decoding and identical-output rate")
    p.set_defaults(func=cmd_demo)
    return parser
