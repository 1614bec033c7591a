"""The ``tandem`` command line."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import __version__


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def _set_threads(n: int | None) -> None:
    import torch

    if n:
        torch.set_num_threads(n)


# ----------------------------------------------------------------------------------------------------
# tandem models


def _unavailable(pair) -> str:
    from .loading import how_to_get
    from .registry import missing_offline

    hints = dict.fromkeys(how_to_get(ref) for ref in missing_offline(pair))  # in order, once each
    return "not available; " + "; ".join(hints)


def cmd_models(args: argparse.Namespace) -> int:
    from .registry import load_registry, missing_offline, preflight

    registry = load_registry(args.models)
    rows = []
    for pair in registry.pairs.values():
        if pair.test_only and not args.all:
            continue
        offline = not missing_offline(pair)
        drafter = {"none": "none (plain decoding)", "prompt-lookup": "prompt lookup"}.get(
            pair.draft, f"{pair.assistant}" + (" + prompt lookup" if pair.draft == "model+prompt-lookup" else "")
            + (", int8 weights" if pair.assistant_int8 else "")
        )
        default = " (default)" if registry.defaults.get(pair.task) == pair.name else ""
        rows.append((pair, default, drafter, offline, preflight(pair, online=args.online)))
    print(f"pairs in {registry.path}")
    for pair, default, drafter, offline, verdict in rows:
        print(f"\n{pair.name}{default}{'  [test only]' if pair.test_only else ''}")
        print(f"  task:        {pair.task}")
        print(f"  main:        {pair.main}")
        print(f"  drafter:     {drafter}{'  (reads the main encoder output)' if pair.share_encoder else ''}")
        print(f"  dtype:       {pair.dtype}")
        print(f"  offline:     {'available' if offline else _unavailable(pair)}")
        print(f"  pre-flight:  {verdict.summary()}")
    failed = [p.name for p, *_, v in rows if v.ok is False]
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------------
# tandem data


def cmd_data_build(args: argparse.Namespace) -> int:
    from .evalsets import SETS, DataBuildError, build_set

    names = args.sets or list(SETS)
    status = 0
    for name in names:
        start = time.perf_counter()
        try:
            info = build_set(name, force=args.force)
        except DataBuildError as exc:
            print(f"{name}: FAILED: {exc}", file=sys.stderr)
            status = 1
            continue
        what = "built" if info.built else "up to date"
        print(f"{name}: {what}, {info.count} items in {info.folder} ({time.perf_counter() - start:.1f} s)")
    return status


def cmd_data_list(args: argparse.Namespace) -> int:
    from .evalsets import MANIFEST, SETS, set_dir

    for name in SETS:
        manifest = set_dir(name) / MANIFEST
        state = f"built: {manifest}" if manifest.is_file() else "not built"
        print(f"{name:18s} {state}")
    return 0


# ----------------------------------------------------------------------------------------------------
# tandem transcribe / demo


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


def _safeguards(args: argparse.Namespace) -> dict:
    return {"temperature": args.temperature, "compression_ratio_threshold": args.compression_ratio_threshold,
            "logprob_threshold": args.logprob_threshold, "no_speech_threshold": args.no_speech_threshold,
            "vad_filter": args.vad_filter}


def cmd_transcribe(args: argparse.Namespace) -> int:
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    from .outputs import FORMATS

    bad = [f for f in formats if f not in FORMATS]
    if bad:
        print(f"tandem: unknown format {bad[0]!r}; choose from {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    from .batch import run_transcribe

    ray = None
    if args.ray is not None:
        from .scale import RayOptions

        try:
            ray = RayOptions(address=args.ray, actors=args.actors, threads_per_actor=args.threads_per_actor,
                             files_per_task=args.files_per_task)
        except ValueError as e:
            print(f"tandem: {e}", file=sys.stderr)
            return 2
    return run_transcribe(args.paths, args.pair, args.language, args.task, args.dtype, args.refs, args.models,
                          use_assistant=not args.no_assistant, compare=args.compare, out=args.out, formats=formats,
                          batch_size=args.batch_size, timestamps=args.timestamps, long_form=args.long_form,
                          lookahead=args.lookahead, safeguards=_safeguards(args), ray=ray)


def _read_texts(args: argparse.Namespace) -> list[str]:
    texts = [sys.stdin.read() if t == "-" else t for t in args.text or []]  # "-": standard input
    for name in args.file or []:
        texts.append(Path(name).read_text(encoding="utf-8"))
    if not texts and not sys.stdin.isatty():
        texts.append(sys.stdin.read())
    return texts


def cmd_text(args: argparse.Namespace) -> int:
    from .metrics import bleu, chrf, rouge
    from .registry import load_registry
    from .text import TextInputError, TextOptions, run_text

    task = args.command
    registry = load_registry(args.models)
    pair = registry.get(args.pair) if args.pair else registry.default(task)
    texts = _read_texts(args)
    if not any(t.strip() for t in texts):  # checked before any model is loaded
        print(f"tandem: the input is empty: nothing to {task} (give TEXT, --file or standard input)", file=sys.stderr)
        return 2
    options = TextOptions(src=getattr(args, "src", None), tgt=getattr(args, "tgt", None),
                          max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                          use_assistant=not args.no_assistant, compare=args.compare,
                          long_input=getattr(args, "long_input", "chunk"))
    try:
        results = run_text(pair, task, texts, options)
    except TextInputError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2
    for r in results:
        for note in r.notes:
            print(f"note: {note}", file=sys.stderr)
        print(r.output)
    tokens = sum(r.tokens for r in results)
    seconds = sum(r.seconds for r in results)
    drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
    calls = sum(r.main_calls for r in results)
    summary = [f"{len(results)} input(s), {tokens} tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tok/s), "
               f"{tokens / max(calls, 1e-9):.2f} tokens per main-model call"]
    if drafted:
        summary.append(f"acceptance {accepted / drafted:.2f}")
    compared = [r for r in results if r.plain_seconds is not None]
    if compared:
        plain_s = sum(r.plain_seconds for r in compared)
        summary.append(f"vs plain {plain_s / max(seconds, 1e-9):.2f}x, identical {sum(bool(r.identical) for r in compared)}/{len(compared)}")
    if args.refs:
        refs = [Path(f).read_text(encoding="utf-8").strip() for f in args.refs]
        hyps = [r.output for r in results]
        if len(refs) != len(hyps):
            print(f"tandem: {len(refs)} references for {len(hyps)} inputs", file=sys.stderr)
            return 2
        if task == "translate":
            summary.append(f"BLEU {bleu(hyps, refs).value:.1f}, chrF {chrf(hyps, refs).value:.1f}")
        else:
            scores = rouge(hyps, refs)
            summary.append("ROUGE-1/2/L " + "/".join(f"{scores[k].value:.3f}" for k in ("rouge1", "rouge2", "rougeL")))
    print("summary: " + "; ".join(summary), file=sys.stderr)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .engine import parse_policy
    from .evaluation import evaluate, format_report, write_report

    try:
        policy = parse_policy(args.lookahead)
    except ValueError as e:
        print(f"tandem: {e}", file=sys.stderr)
        return 2
    report = evaluate(args.task, args.pair, args.set, limit=args.limit, repeats=args.repeats, dtype=args.dtype,
                      models=args.models, policy=policy)
    print(format_report(report))
    if args.json:
        write_report(report, args.json)
        print(f"wrote {args.json}")
    return 0


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from .bench import bench_engine

    bench_engine(limit=args.limit, json_path=args.json, include_toys=not args.no_toys, end_to_end=args.end_to_end,
                 dtype=args.dtype)
    return 0


def cmd_bench_asr(args: argparse.Namespace) -> int:
    from .bench import bench_asr

    sets = tuple(x.strip() for x in args.sets.split(",") if x.strip())
    bench_asr(args.pair, sets, args.limit, args.batch_size, args.json, chunk_batch=args.chunk_batch)
    return 0


def cmd_bench_text(args: argparse.Namespace) -> int:
    from .bench_text import bench_text

    bench_text(args.task, args.pair, args.limit, args.max_new_tokens, args.json)
    return 0


def cmd_bench_scale(args: argparse.Namespace) -> int:
    from .scale import require_ray
    from .scale.bench import bench_scale

    try:
        require_ray()
    except ImportError as e:
        print(f"tandem: {e}", file=sys.stderr)
        return 2
    actors = tuple(int(x) for x in args.actors.split(",") if x.strip())
    bench_scale(args.pair, args.set, args.limit, args.batch_size, actors, args.threads_per_actor, args.json)
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    from .distill import DistillOptions, distill

    data = tuple(args.data) if args.data else ("debian-speech",)
    opts = DistillOptions(main=args.main, out=Path(args.out), layers=args.layers, data=data, clips=args.clips,
                          heldout=args.heldout, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                          draft_vocab=args.draft_vocab, budget_minutes=args.budget_minutes, resume=args.resume)
    folder = distill(opts)
    if folder is None:
        print(f"stopped at the budget; go on with: tandem distill ... --out {args.out} --resume")
        return 3
    print(f"assistant: {folder} (see CARD.md there)")
    return 0


def cmd_regress(args: argparse.Namespace) -> int:
    from .paths import PROJECT_ROOT
    from .regress import accept, load_config, regress

    config = load_config(args.config or PROJECT_ROOT / "data" / "nightly.yaml")
    if args.accept is not None:
        accept(config, args.accept)
        print(f"run {args.accept} accepted: it is now the baseline")
        return 0
    run_id, findings, notes, report = regress(config, pin=args.pin)
    for line in notes:
        print(line, file=sys.stderr)
    for f in findings:
        print(f"REGRESSION: {f.line}", file=sys.stderr)
    print(f"run {run_id}: {'FAIL' if findings else 'PASS'}; report {report}")
    return 1 if findings else 0


def ui_command(port: int) -> list[str]:
    """The streamlit command line that serves ui/app.py on 127.0.0.1 (usage statistics off)."""
    from .paths import PROJECT_ROOT

    return [sys.executable, "-m", "streamlit", "run", str(PROJECT_ROOT / "ui" / "app.py"),
            "--server.address", "127.0.0.1", "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false"]


def cmd_ui(args: argparse.Namespace) -> int:
    from .paths import PROJECT_ROOT

    env = dict(os.environ)
    if args.models:
        env["TANDEM_MODELS"] = str(Path(args.models).resolve())
    print(f"Tandem UI on http://127.0.0.1:{args.port} (Ctrl-C stops it)")
    return serve(ui_command(args.port), cwd=PROJECT_ROOT / "ui", env=env)


def serve(command: list[str], cwd: Path, env: dict[str, str]) -> int:
    """Run a server child until it exits, handing it SIGINT and SIGTERM (``kill PID`` on us stops it too, so
    it never outlives us holding its port). Returns its exit status (128 + the signal for a signalled exit)."""
    import signal
    import subprocess

    child = subprocess.Popen(command, cwd=cwd, env=env)

    def forward(signum, _frame) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # a handler replaced by an embedding caller: pass it on and keep waiting
                forward(signal.SIGINT, None)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def cmd_demo(args: argparse.Namespace) -> int:
    """Build the real-speech sample set and transcribe it on the default ASR pair, also decoding plainly
    (--compare) so the summary shows the speedup and the identical-output rate next to the WER."""
    from .batch import run_transcribe
    from .evalsets import MANIFEST, build_set

    info = build_set("speech-real")
    print(f"sample audio: {info.count} real utterances in {info.folder / 'audio'}")
    return run_transcribe([str(info.folder / "audio")], None, "en", "transcribe", None,
                          str(info.folder / MANIFEST), args.models, compare=True, batch_size=1)


# ----------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem",
        description="Faster speech recognition, translation and summarization with assisted decoding, same output.",
    )
    parser.add_argument("--version", action="version", version=f"tandem {__version__}")
    parser.add_argument("--models", metavar="FILE", help="pair registry to use (default: the project's models.yaml, or $TANDEM_MODELS)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list every pair: task, weights, offline availability, pre-flight verdict")
    p.add_argument("--all", action="store_true", help="include test-only pairs")
    p.add_argument("--online", action="store_true", help="fetch configs and tokenizers of hub models for the pre-flight")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("data", help="build and list the offline evaluation sets")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    b = data_sub.add_parser("build", help="build sets (all when none is named); a second run does nothing")
    b.add_argument("sets", nargs="*", metavar="SET", help="speech-real, speech-synth, speech-long, translate-udhr, summarize-own, summarize-debian")
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    b.set_defaults(func=cmd_data_build)
    ls = data_sub.add_parser("list", help="which sets are built, and where")
    ls.set_defaults(func=cmd_data_list)

    p = sub.add_parser("transcribe", help="transcribe audio or video files, folders (recursive) or globs")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--pair", help="asr pair from the registry (default: the registry's asr default)")
    p.add_argument("--language", default="en", help="language code, or 'auto' to detect per file (default: en); "
                   "English-only (.en) pairs take en or auto only")
    p.add_argument("--task", choices=["transcribe", "translate"], default="transcribe")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="compute dtype (default: the pair's)")
    p.add_argument("--refs", metavar="MANIFEST", help="a manifest.jsonl with reference texts: prints WER")
    p.add_argument("--out", metavar="DIR", help="write outputs here (mirroring the input folders), resumable")
    p.add_argument("--formats", default="txt", help="comma-separated: txt,json,srt,vtt,tsv (default: txt)")
    p.add_argument("--batch-size", type=int, default=4,
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
    p.add_argument("--actors", type=int, default=None, metavar="N",
                   help="with --ray: decoding actors, each loading the pair once (default: one per GPU, else one "
                        "per --threads-per-actor CPUs of the cluster)")
    p.add_argument("--threads-per-actor", type=int, default=1, metavar="N",
                   help="with --ray: torch threads (and CPUs reserved) per actor (default: 1)")
    p.add_argument("--files-per-task", type=int, default=None, metavar="N",
                   help="with --ray: files handed to an actor at a time, the most a dying actor costs "
                        "(default: --batch-size)")
    p.set_defaults(func=cmd_transcribe)

    for task, helptext in (("translate", "translate text (sentences batched through the engine)"),
                           ("summarize", "summarize text (chunked when longer than the model's input)")):
        p = sub.add_parser(task, help=helptext)
        p.add_argument("text", nargs="*", metavar="TEXT", help="texts ('-' or none: standard input; or --file)")
        p.add_argument("--file", action="append", metavar="FILE", help="read a text from FILE (repeatable)")
        p.add_argument("--pair", help=f"{task} pair from the registry (default: the registry's {task} default)")
        if task == "translate":
            p.add_argument("--src", help="source language, as the pair lists it (the embedded Qwen pair: en, de, fr, ...; NLLB: eng_Latn)")
            p.add_argument("--tgt", help="target language, as the pair lists it (e.g. de; NLLB: deu_Latn)")
        else:
            p.add_argument("--long-input", choices=["chunk", "truncate"], default="chunk",
                           help="text longer than the model's input: summarise in chunks (default) or truncate")
        p.add_argument("--max-new-tokens", type=int, help="per sentence/chunk (default: the model's)")
        p.add_argument("--batch-size", type=int, default=8)
        p.add_argument("--no-assistant", action="store_true", help="plain decoding with the main model")
        p.add_argument("--compare", action="store_true", help="also decode plainly: speedup and identical outputs")
        p.add_argument("--refs", action="append", metavar="FILE", help="reference text per input: BLEU/chrF or ROUGE")
        p.set_defaults(func=cmd_text)

    p = sub.add_parser("eval", help="quality and latency of plain vs assisted decoding for one pair and set (JSON)")
    p.add_argument("--task", required=True, choices=["asr", "translate", "summarize"])
    p.add_argument("--pair", required=True, help="pair from the registry")
    p.add_argument("--set", required=True, help="evaluation set (tandem data build SET)")
    p.add_argument("--limit", type=int, help="first N items only")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timed runs per mode (default: 3)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="compute dtype (default: the pair's)")
    p.add_argument("--json", metavar="FILE", help="write the report (schema tandem-eval/1) here")
    p.add_argument("--lookahead", default="adaptive", metavar="POLICY[:N]",
                   help="drafts per round: adaptive (default), constant:N, heuristic:N, confidence, random:SEED")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("bench", help="side-by-side speed benchmarks (tables + JSON)")
    bench_sub = p.add_subparsers(dest="bench_command", required=True)
    b = bench_sub.add_parser("engine", help="transformers plain/assisted vs Tandem plain/assisted/batched, same inputs")
    b.add_argument("--limit", type=int, default=24, help="speech inputs (speech-real, then speech-synth) (default: 24)")
    b.add_argument("--json", default="reports/bench-engine.json", help="where to write the figures (default: %(default)s)")
    b.add_argument("--no-toys", action="store_true", help="skip the random-weight BART and Llama pairs")
    b.add_argument("--end-to-end", action="store_true", help="time the encoder too (default: decode only, encoder output shared)")
    b.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="Whisper pairs' dtype (default: float32)")
    b.set_defaults(func=cmd_bench_engine)
    b = bench_sub.add_parser("asr", help="faster-whisper, transformers, Tandem plain/assisted in float32 and bfloat16, same files")
    b.add_argument("--pair", default="whisper-base", help="asr pair (default: %(default)s)")
    b.add_argument("--sets", default="speech-real,speech-synth,speech-long", help="comma-separated sets (default: %(default)s)")
    b.add_argument("--limit", type=int, default=60, help="files per set at most (default: %(default)s)")
    b.add_argument("--batch-size", type=int, default=8, help="Tandem's files per batch (default: %(default)s)")
    b.add_argument("--chunk-batch", type=int, default=8,
                   help="sets with files over 30 s: chunks per batch of the chunked long-form rows, Tandem's and "
                        "faster-whisper's batched pipeline (default: %(default)s)")
    b.add_argument("--json", default="reports/bench-asr.json", help="where to write the figures (default: %(default)s)")
    b.set_defaults(func=cmd_bench_asr)
    b = bench_sub.add_parser("text", help="transformers plain/assisted vs Tandem plain and each drafter, same chat prompts, batch 1")
    b.add_argument("--task", choices=["summarize", "translate"], default="summarize")
    b.add_argument("--pair", help="text pair from the registry (default: the task's default, the embedded Qwen pair)")
    b.add_argument("--limit", type=int, default=4, help="items of summarize-own / translate-udhr (default: %(default)s)")
    b.add_argument("--max-new-tokens", type=int, default=256, help="per prompt (default: %(default)s)")
    b.add_argument("--json", default="reports/bench-text.json", help="where to write the figures (default: %(default)s)")
    b.set_defaults(func=cmd_bench_text)
    b = bench_sub.add_parser("scale", help="the batch job in-process (1 thread, every core) vs on a local Ray actor pool: "
                                          "files per minute, Ray's start-up (needs the 'scale' extra)")
    b.add_argument("--pair", help="asr pair (default: the registry's asr default)")
    b.add_argument("--set", default="speech-real", help="evaluation set (default: %(default)s)")
    b.add_argument("--limit", type=int, default=12, help="files at most (default: %(default)s)")
    b.add_argument("--batch-size", type=int, default=4, help="windows decoded together (default: %(default)s)")
    b.add_argument("--actors", default="1,2", help="comma-separated actor counts, one Ray row each (default: %(default)s)")
    b.add_argument("--threads-per-actor", type=int, default=1, help="torch threads per actor (default: %(default)s)")
    b.add_argument("--json", default="reports/bench-scale.json", help="where to write the figures (default: %(default)s)")
    b.set_defaults(func=cmd_bench_scale)

    p = sub.add_parser("distill", help="make a small assistant for a main model: corpus, labels from the main model, training, export")
    p.add_argument("--main", required=True, metavar="PAIR_OR_MODEL", help="a pair (its main model), an embedded name, a folder or a hub id")
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the assistant (initialised from the main's first, last, and between)")
    p.add_argument("--data", nargs="+", metavar="SET", help="corpus: debian-speech (Whisper; the default) or text files of one input a line (text models)")
    p.add_argument("--out", required=True, metavar="DIR", help="working folder: shards, checkpoints, and the exported assistant in DIR/assistant")
    p.add_argument("--clips", type=int, default=4000, help="training items to build and label (default 4000; raise it and --resume to grow the corpus)")
    p.add_argument("--heldout", type=int, default=96, help="held-out items (shard 0) for the agreement estimate")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--draft-vocab", type=int, default=16384, help="tokens kept by the draft head (plus special tokens); 0 keeps all")
    p.add_argument("--budget-minutes", type=float, default=None, help="stop cleanly after this long (exit 3); --resume goes on")
    p.add_argument("--resume", action="store_true", help="go on from what DIR holds")
    p.set_defaults(func=cmd_distill)

    p = sub.add_parser("regress", help="nightly regression run: evaluations, history (SQLite), baseline, thresholds, report with plots; exit 1 on a regression")
    p.add_argument("--config", metavar="FILE", help="regression config (default: data/nightly.yaml)")
    p.add_argument("--pin", type=int, metavar="RUN", help="compare with this run instead of the last accepted one")
    p.add_argument("--accept", type=int, metavar="RUN", help="accept a run by hand (an intended change) and exit")
    p.set_defaults(func=cmd_regress)

    p = sub.add_parser("ui", help="serve the Streamlit app (Translate, Summarize, Transcribe) on 127.0.0.1")
    p.add_argument("--port", type=int, default=8501)
    p.set_defaults(func=cmd_ui)

    p = sub.add_parser("demo", help="the main job on sample audio: build speech-real and transcribe it with the default "
                                  "pair, with WER, speedup over plain decoding and identical-output rate")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    _quiet_libraries()
    args = build_parser().parse_args(argv)
    _set_threads(args.threads)
    from .asr import LanguageError
    from .audio import AudioDecodeError
    from .distill import DistillError
    from .regress import RegressConfigError, RegressRunError
    from .evalsets import DataBuildError
    from .loading import ModelUnavailableError
    from .registry import RegistryError

    try:
        return args.func(args)
    except (RegistryError, ModelUnavailableError, DataBuildError, AudioDecodeError, DistillError, RegressConfigError,
            RegressRunError, LanguageError) as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tandem: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
