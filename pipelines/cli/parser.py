"""The ``tandem`` argument parser: one ``add_<command>`` function a command (``--help`` and ``docs/cli.md``
are generated from here; the shared types and options are in ``arguments``)."""

from __future__ import annotations

import argparse

from .. import __version__
from ..devices import TORCH_WEIGHT_DTYPES, WEIGHT_DTYPES
from .arguments import (
    DEVICE_HELP,
    WEIGHT_DTYPE_HELP,
    WHISPER_DTYPE_HELP,
    HelpFormatter,
    add_alias,
    add_command,
    add_dtype,
    add_lookahead,
    add_model,
    add_prompts,
    add_report,
    add_search,
    add_whisper_spellings,
    add_words,
    count,
    port,
    positive,
    temperatures,
    threshold,
    whole_number,
)
from .bench_parser import add_bench
from .commands import (
    cmd_data_build,
    cmd_data_list,
    cmd_demo,
    cmd_distill,
    cmd_eval,
    cmd_models,
    cmd_regress,
    cmd_serve,
    cmd_text,
    cmd_transcribe,
    cmd_ui,
)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``tandem`` parser: global options, then every command's subparser."""
    parser = argparse.ArgumentParser(
        prog="tandem", formatter_class=HelpFormatter,
        description="Faster speech recognition, translation and summarization with assisted decoding, same output.",
    )
    parser.add_argument("--version", action="version", version=f"tandem {__version__}")
    parser.add_argument("--models", metavar="FILE", help="pair registry to use (default: the project's models.yaml, "
                        "or $TANDEM_MODELS)")
    parser.add_argument("--threads", type=count, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", metavar="DEVICE", default=None, help=DEVICE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (add_transcribe, add_translate, add_summarize, add_demo, add_ui, add_serve, add_models, add_data,
                add_eval, add_bench, add_regress, add_distill):
        add(sub)
    return parser


def add_models(sub) -> None:
    p = add_command(sub, "models", help="list every pair: task, weights, offline availability, pre-flight verdict")
    p.add_argument("--all", action="store_true", help="include test-only pairs")
    p.add_argument("--online", action="store_true", help="fetch configs and tokenizers of hub models for the pre-flight")
    p.set_defaults(func=cmd_models)


def add_data(sub) -> None:
    p = add_command(sub, "data", help="build and list the offline evaluation sets")
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="COMMAND")
    b = add_command(data_sub, "build", help="build sets (all when none is named); a second run does nothing")
    b.add_argument("sets", nargs="*", metavar="SET", help="speech-real, speech-synth, speech-long, translate-udhr, "
                   "summarize-own, summarize-debian")
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    b.set_defaults(func=cmd_data_build)
    ls = add_command(data_sub, "list", help="which sets are built, and where")
    ls.set_defaults(func=cmd_data_list)


def add_transcribe(sub) -> None:
    p = add_command(sub, "transcribe", help="transcribe audio or video files, folders (recursive) or globs")
    p.add_argument("paths", nargs="+", metavar="PATH", help="audio or video files, folders or globs")
    add_model(p, "asr pair from the registry (default: the registry's asr default, whisper-base+distilled)")
    p.add_argument("--language", default="en", help="language code, or 'auto' to detect per file; English-only "
                   "(.en) pairs take en or auto only")
    p.add_argument("--task", choices=["transcribe", "translate"], default="transcribe",
                   help="Whisper's task: transcribe in the spoken language, or translate into English")
    add_dtype(p, WHISPER_DTYPE_HELP, weights=TORCH_WEIGHT_DTYPES)
    p.add_argument("--refs", metavar="MANIFEST", help="a manifest.jsonl with reference texts: prints WER")
    p.add_argument("-o", "--output-dir", "--out", dest="out", metavar="DIR",
                   help="write outputs here (mirroring the input folders), resumable")
    add_alias(p, "--output_dir", dest="out", metavar="DIR")
    p.add_argument("--force", action="store_true", help="redo and overwrite transcripts in the output folder "
                   "made with another pair or other decoding options (refused without it)")
    p.add_argument("-f", "--output-format", "--formats", dest="formats", default="txt", metavar="FORMATS",
                   help="comma-separated: txt,json,srt,vtt,tsv, or all, written into --output-dir (without it only "
                   "txt, printed; others are refused); into an --output-dir of finished "
                   "transcripts, the formats not there yet are written from each file's record, without decoding")
    add_alias(p, "--output_format", dest="formats", metavar="FORMATS")
    p.add_argument("--batch-size", type=count, default=4,
                   help="windows decoded together: of different files, or with --long-form chunked also chunks of one file")
    p.add_argument("--long-form", choices=["sequential", "chunked"], default="sequential",
                   help="files over 30 s: window after window as Whisper seeks, or cut at pauses into chunks of "
                        "15-26 s decoded several at a time (faster in batches; wording may differ at chunk edges)")
    p.add_argument("--timestamps", action="store_true", help="timestamp tokens even for clips under 30 s (on for srt/vtt/tsv)")
    p.add_argument("--audio-track", type=whole_number(0), default=None, metavar="N",
                   help="which audio stream of a file with several (0-based, among the audio streams; default: "
                        "the first with speech in a few seconds sampled from each)")
    p.add_argument("--no-assistant", action="store_true", help="plain decoding with the pair's main model")
    p.add_argument("--compare", action="store_true", help="also decode plainly: speedup and identical-output rate")
    add_lookahead(p)
    add_safeguards(p)
    p.add_argument("--vad-filter", action=argparse.BooleanOptionalAction, default=False,
                   help="Silero voice-activity filter before decoding (faster-whisper's model; pip install -e "
                        "'.[vad]'): audio outside speech is not decoded, timestamps stay the file's")
    add_prompts(p)
    add_search(p)
    add_words(p)
    add_ray(p)
    add_whisper_spellings(p)
    p.set_defaults(func=cmd_transcribe)


def add_safeguards(p: argparse.ArgumentParser) -> None:
    """Whisper's temperature fallback and its thresholds, with whisper's names and defaults."""
    p.add_argument("--temperature", type=temperatures, default=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), metavar="T[,T...]",
                   help="Whisper's temperature fallback: the first decodes greedily, each retry samples at the next "
                        "(assisted, exact speculative sampling) (default: 0,0.2,0.4,0.6,0.8,1.0; 0 alone: no fallback)")
    p.add_argument("--compression-ratio-threshold", type=threshold, default=2.4, metavar="X",
                   help="fall back when the text's gzip compression ratio is above X ('off': never)")
    p.add_argument("--logprob-threshold", type=threshold, default=-1.0, metavar="X",
                   help="fall back when the average log-probability is below X ('off': never)")
    p.add_argument("--no-speech-threshold", type=threshold, default=0.6, metavar="P",
                   help="skip a window as silence when p(no speech) is above P and the average log-probability is "
                        "below --logprob-threshold ('off': never)")


def add_ray(p: argparse.ArgumentParser) -> None:
    """The batch job on a Ray actor pool."""
    p.add_argument("--ray", nargs="?", const="auto", metavar="auto|local|ADDRESS",
                   help="decode on a Ray actor pool (needs pip install -e '.[scale]'): auto (the cluster this machine "
                        "belongs to or $RAY_ADDRESS, else a local one; the default when --ray has no value), local (a "
                        "new local one), or a cluster's ADDRESS (host:6379 or ray://host:10001)")
    p.add_argument("--actors", type=count, default=None, metavar="N",
                   help="with --ray: decoding actors, each loading the pair once (default: one per GPU, else one "
                        "per --threads-per-actor CPUs of the cluster)")
    p.add_argument("--threads-per-actor", type=count, default=1, metavar="N",
                   help="with --ray: torch threads (and CPUs reserved) per actor")
    p.add_argument("--files-per-task", type=count, default=None, metavar="N",
                   help="with --ray: files handed to an actor at a time, the most a dying actor costs "
                        "(default: --batch-size)")


def add_text_options(p: argparse.ArgumentParser, task: str) -> None:
    """The options translate and summarize share."""
    p.add_argument("text", nargs="*", metavar="TEXT", help="texts ('-' or none: standard input; or --file)")
    p.add_argument("--file", action="append", metavar="FILE", help="read a text from FILE (repeatable)")
    add_model(p, f"{task} pair from the registry (default: the registry's {task} default)")
    p.add_argument("--max-new-tokens", type=count, help="per sentence/chunk (default: the model's)")
    p.add_argument("--batch-size", type=count, default=8, help="inputs decoded together")
    p.add_argument("--no-assistant", action="store_true", help="plain decoding with the main model")
    p.add_argument("--compare", action="store_true", help="also decode plainly: speedup and identical outputs")
    p.add_argument("--refs", action="append", metavar="FILE", help="reference text per input: BLEU/chrF or ROUGE")
    add_dtype(p, WEIGHT_DTYPE_HELP, weights=WEIGHT_DTYPES)
    p.set_defaults(func=cmd_text)


def add_translate(sub) -> None:
    p = add_command(sub, "translate", help="translate text (paragraphs and sentences batched through the engine)")
    add_text_options(p, "translate")
    p.add_argument("--src", help="source language, as the pair lists it (the embedded Qwen pair: en, de, fr, ...; "
                   "NLLB: eng_Latn)")
    p.add_argument("--tgt", help="target language, as the pair lists it (e.g. de; NLLB: deu_Latn)")
    p.add_argument("--format", choices=["auto", "text", "markdown", "html"], default="auto", help="the input's layout, kept in the output (auto: HTML by .html/.htm or a leading tag, markdown by .md, else text)")


def add_summarize(sub) -> None:
    p = add_command(sub, "summarize", help="summarize text (chunked when longer than the model's input)")
    add_text_options(p, "summarize")
    p.add_argument("--long-input", choices=["chunk", "truncate"], default="chunk",
                   help="text longer than the model's input: summarise in chunks, or truncate")


def add_eval(sub) -> None:
    p = add_command(sub, "eval", help="quality and latency of plain vs assisted decoding for one pair and set (JSON)")
    add_model(p, "pair from the registry", required=True)
    p.add_argument("--set", required=True, help="evaluation set (tandem data build SET); it names the task: "
                   "speech-* asr, translate-* translate, summarize-* summarize")
    add_alias(p, "--task", dest="task", choices=["asr", "translate", "summarize"])  # the set names it now
    p.add_argument("--limit", type=count, help="first N items only")
    p.add_argument("--repeats", type=count, default=3, help="interleaved timed runs per mode")
    add_dtype(p, "dtype (default: the pair's); int8 / int4: the decoders' linear layers quantized on a CPU, for "
              "Whisper and the Llama-layout text pairs (docs/transcription.md, docs/text.md); q4_k_m: a text pair's "
              "main model as its GGUF file on llama.cpp (the 'gguf' extra; docs/text.md)",
              weights=WEIGHT_DTYPES)
    add_report(p, None, "write the report (schema tandem-eval/1) here")
    add_lookahead(p)
    p.set_defaults(func=cmd_eval)


def add_regress(sub) -> None:
    p = add_command(sub, "regress", help="nightly regression run: evaluations, history (SQLite), baseline, "
                    "thresholds, report with plots; exit 1 on a regression")
    p.add_argument("--config", metavar="FILE", help="regression config (default: data/nightly.yaml)")
    p.add_argument("--pin", type=int, metavar="RUN", help="compare with this run instead of the last accepted one")
    p.add_argument("--accept", type=int, metavar="RUN", help="accept a run by hand (an intended change) and exit")
    p.set_defaults(func=cmd_regress)


def add_ui(sub) -> None:
    p = add_command(sub, "ui", help="serve the Streamlit app (Translate, Summarize, Transcribe) on 127.0.0.1")
    p.add_argument("--port", type=port, default=8501, help="the Streamlit server's port")
    p.set_defaults(func=cmd_ui)


def add_serve(sub) -> None:
    p = add_command(sub, "serve", help="an OpenAI-compatible HTTP server (/v1/audio/transcriptions, /v1/chat/"
                    "completions, /v1/models, /metrics; needs pip install -e '.[serve]'; docs/server.md)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind; any other than loopback needs --api-key")
    p.add_argument("--port", type=port, default=8000, help="TCP port")
    add_model(p, "asr pair served at /v1/audio/* (default: the registry's asr default; 'whisper-1' names it too)")
    p.add_argument("--text-model", metavar="NAME", help="a chat text pair served at /v1/chat/completions (e.g. "
                   "qwen2.5-coder-1.5b+0.5b-translate; default: none)")
    add_dtype(p)
    p.add_argument("--max-batch", type=count, default=8, metavar="N", help="requests (their windows) decoded together")
    p.add_argument("--max-wait-ms", type=whole_number(0, 60000), default=10, metavar="MS",
                   help="how long a batch that could start waits for more requests")
    p.add_argument("--api-key", metavar="KEY", help="clients must send 'Authorization: Bearer KEY' (default: "
                   "$TANDEM_API_KEY; none on loopback)")
    p.add_argument("--max-upload-mb", type=positive, default=25.0, metavar="MB", help="largest audio upload (413 "
                   "beyond)")
    p.set_defaults(func=cmd_serve)


def add_demo(sub) -> None:
    p = add_command(sub, "demo", help="the main job on sample audio: build speech-real and transcribe it with the "
                    "default pair, with WER, speedup over plain decoding and identical-output rate")
    p.set_defaults(func=cmd_demo)


def add_distill(sub) -> None:
    p = add_command(sub, "distill", help="make a small assistant for a main model: corpus, labels from the main "
                    "model, training, export")
    p.add_argument("--main", required=True, metavar="PAIR_OR_MODEL", help="a pair (its main model), an embedded "
                   "name, a folder or a hub id")
    p.add_argument("--layers", type=count, default=2, help="decoder layers of the assistant")
    p.add_argument("--init", choices=("spread", "first"), default="spread", help="the main decoder's layers the "
                   "assistant starts from: spread (first, last and between) or first (the main model's early exit)")
    p.add_argument("--drafter", choices=("student", "medusa"), default="student", help="the drafter's design: a "
                   "shallow student decoder, or medusa: heads on the main decoder's hidden state (Whisper, "
                   "with --curve: measured, not exported)")
    p.add_argument("--heads", type=count, default=5, help="--drafter medusa: draft heads")
    p.add_argument("--data", nargs="+", metavar="CORPUS", help="corpus: debian-speech (Whisper; the default) or text "
                   "files of one input a line (text models)")
    p.add_argument("-o", "--output-dir", "--out", dest="out", required=True, metavar="DIR",
                   help="working folder: shards, checkpoints, and the exported assistant in DIR/assistant")
    p.add_argument("--clips", type=count, default=4000, help="training items; items the corpus does not hold yet "
                   "are labelled and added to it")
    p.add_argument("--heldout", type=int, default=96,
                   help="held-out items (shard 0; Whisper, without --curve: as many held-out fortunes too) for the "
                        "agreement estimate")
    p.add_argument("--epochs", type=positive, default=3.0,
                   help="passes over the training items (--steps instead counts optimizer steps)")
    p.add_argument("--batch-size", type=count, default=16, help="clips per optimizer step")
    p.add_argument("--lr", type=positive, default=3e-4,
                   help="AdamW's peak learning rate, after a warm-up and before cosine decay")
    p.add_argument("--draft-vocab", type=int, default=16384, help="tokens kept by the draft head (plus special "
                   "tokens); 0 keeps all")
    p.add_argument("--budget-minutes", type=positive, default=None, help="stop cleanly after this long (exit 3); "
                   "--resume goes on")
    p.add_argument("--resume", action="store_true", help="go on from what DIR holds")
    p.add_argument("--corpus", metavar="DIR", help="Whisper: the labelled corpus kept in the repository, read and "
                   "grown (default: data/distill/<main model>)")
    p.add_argument("--label-only", action="store_true", help="grow the corpus to --clips training items (labels "
                   "only, no training features), then stop before training")
    p.add_argument("--curve", metavar="N,N,...", help="Whisper: the learning curve by corpus size: a student "
                   "trained on the first N clips for each N (the same steps each), measured on the held-out shard "
                   "and speech-real; the largest size's student is exported with the curve on its card")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per training (default: --epochs over "
                   "the training items; with --curve, over the largest size)")
    p.add_argument("--shards", metavar="A-B,C,...", help="Whisper: train on these shards of the corpus only (e.g. "
                   "317-360: the clips added since an assistant was trained; shards it lacks are labelled and "
                   "added), not --clips' first ones")
    p.add_argument("--start", metavar="shipped|DIR", help="Whisper: go on training an exported assistant (shipped: "
                   "the one shipped for --main; DIR: a distill run's folder or its assistant) instead of the main "
                   "model's layers; the draft vocabulary is then counted over the whole corpus")
    p.set_defaults(func=cmd_distill)
