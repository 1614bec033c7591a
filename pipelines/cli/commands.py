"""The ``tandem`` commands: one ``cmd_*`` function per command, each taking the parsed arguments (their device
already resolved, ``args.device``) and returning the exit status (0 done, 1 some work failed or a regression, 2
the command could not start)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# ----------------------------------------------------------------------------------------------------
# tandem models


def _unavailable(pair) -> str:
    from ..models.loading import how_to_get
    from ..models.registry import missing_offline

    hints = dict.fromkeys(how_to_get(ref) for ref in missing_offline(pair))  # in order, once each
    return "not available; " + "; ".join(hints)


def cmd_models(args: argparse.Namespace) -> int:
    from ..models.registry import load_registry, missing_offline, preflight

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
    from ..quality.sets import SETS, DataBuildError, build_set

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
    from ..quality.sets import MANIFEST, SETS, set_dir

    for name in SETS:
        manifest = set_dir(name) / MANIFEST
        state = f"built: {manifest}" if manifest.is_file() else "not built"
        print(f"{name:18s} {state}")
    return 0


# ----------------------------------------------------------------------------------------------------
# tandem transcribe / demo


def cmd_transcribe(args: argparse.Namespace) -> int:
    from .transcribe import output_formats, ray_options, run_transcribe, subtitle_options, transcribe_options

    formats = output_formats(args.formats, args.out)
    return run_transcribe(args.paths, args.pair, transcribe_options(args, formats), refs=args.refs,
                          models=args.models, out=args.out, formats=formats, ray=ray_options(args),
                          subtitles=subtitle_options(args), force=args.force)


def _read_text_file(name: str, what: str) -> str:
    """A UTF-8 text file's contents; TextInputError naming the file when it is missing, not a file, unreadable or
    not UTF-8 text."""
    from ..text import TextInputError

    path = Path(name)
    try:
        if path.is_dir():
            raise TextInputError(f"{what} {name} is a folder, not a text file")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TextInputError(f"{what} {name} does not exist") from None
    except UnicodeDecodeError as exc:
        raise TextInputError(f"{what} {name} is not UTF-8 text (at byte offset {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise TextInputError(f"{what} {name} cannot be read: {exc.strerror or exc}") from None


def _read_texts(args: argparse.Namespace) -> list[str]:
    """The inputs: TEXT arguments ("-": standard input), then each --file; with neither, standard input when it is
    not a terminal. TextInputError for a file that cannot be read as text."""
    texts = [sys.stdin.read() if t == "-" else t for t in args.text or []]  # "-": standard input
    for name in args.file or []:
        texts.append(_read_text_file(name, "--file"))
    if not texts and not sys.stdin.isatty():
        texts.append(sys.stdin.read())
    return texts


def cmd_text(args: argparse.Namespace) -> int:
    from ..models.registry import load_registry
    from ..quality.metrics import bleu, chrf, rouge
    from ..text import TextInputError, TextOptions, run_text

    task = args.command
    registry = load_registry(args.models)
    pair = registry.get(args.pair) if args.pair else registry.default(task)
    # inputs, references and options checked before any model is loaded (TextInputError: main prints it, exit 2)
    texts = _read_texts(args)
    if not any(t.strip() for t in texts):
        raise TextInputError(f"the input is empty: nothing to {task} (give TEXT, --file or standard input)")
    refs = [_read_text_file(f, "--refs").strip() for f in args.refs or []]
    options = TextOptions(src=getattr(args, "src", None), tgt=getattr(args, "tgt", None),
                          max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                          use_assistant=not args.no_assistant, compare=args.compare,
                          long_input=getattr(args, "long_input", "chunk"), text_format=getattr(args, "format", "auto"))
    if refs and len(refs) != len(texts):
        raise TextInputError(f"{len(refs)} references for {len(texts)} inputs (one --refs file per input)")
    files = args.file or []  # file names tell HTML and markdown by suffix (TEXT and standard input come first)
    results = run_text(pair, task, texts, options, device=args.device, dtype=args.dtype, names=[None] * (len(texts) - len(files)) + files)
    for r in results:
        for note in r.notes:
            print(f"note: {note}", file=sys.stderr)
        print(r.output)
    tokens = sum(r.tokens for r in results)
    seconds = sum(r.seconds for r in results)
    drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
    calls = sum(r.main_calls for r in results)
    summary = [f"{len(results)} input(s) on {args.device}, {tokens} tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tok/s), "
               f"{tokens / max(calls, 1e-9):.2f} tokens per main-model call"]
    if drafted:
        summary.append(f"acceptance {accepted / drafted:.2f}")
    compared = [r for r in results if r.plain_seconds is not None]
    if compared:
        plain_s = sum(r.plain_seconds for r in compared)
        summary.append(f"vs plain {plain_s / max(seconds, 1e-9):.2f}x, identical {sum(bool(r.identical) for r in compared)}/{len(compared)}")
    if refs:
        hyps = [r.output for r in results]
        if task == "translate":
            summary.append(f"BLEU {bleu(hyps, refs).value:.1f}, chrF {chrf(hyps, refs).value:.1f}")
        else:
            scores = rouge(hyps, refs)
            summary.append("ROUGE-1/2/L " + "/".join(f"{scores[k].value:.3f}" for k in ("rouge1", "rouge2", "rougeL")))
    print("summary: " + "; ".join(summary), file=sys.stderr)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from ..engine import parse_policy
    from ..quality.evaluation import evaluate, format_report, task_of_set, write_report

    try:
        policy = parse_policy(args.lookahead)
    except ValueError as e:
        print(f"tandem: {e}", file=sys.stderr)
        return 2
    task = getattr(args, "task", None) or task_of_set(args.set)  # --task: the older spelling
    report = evaluate(task, args.pair, args.set, limit=args.limit, repeats=args.repeats, dtype=args.dtype,
                      models=args.models, policy=policy, device=args.device)  # EvalRequestError: exit 2
    print(format_report(report))
    if args.json:
        write_report(report, args.json)
        print(f"wrote {args.json}")
    return 0


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from ..quality.bench import bench_engine

    bench_engine(limit=args.limit, json_path=args.json, include_toys=not args.no_toys, end_to_end=args.end_to_end,
                 dtype=args.dtype, device=args.device)
    return 0


def cmd_bench_asr(args: argparse.Namespace) -> int:
    from ..quality.bench_asr import bench_asr

    sets = tuple(x.strip() for x in args.sets.split(",") if x.strip())
    bench_asr(args.pair, sets, args.limit, args.batch_size, args.json, chunk_batch=args.chunk_batch, device=args.device,
              also=tuple(args.also), dtypes=args.dtypes, peers=args.peers)
    return 0


def cmd_bench_shapes(args: argparse.Namespace) -> int:
    from ..quality.bench_shapes import bench_shapes

    acceptances = tuple(float(a) for a in args.acceptance.split(",") if a.strip())
    if not acceptances or any(not 0.0 <= a <= 1.0 for a in acceptances):
        print(f"tandem: --acceptance takes numbers from 0 to 1, not {args.acceptance!r}", file=sys.stderr)
        return 2
    try:
        lookaheads = tuple(int(k) for k in args.lookahead.split(",") if k.strip())
    except ValueError:
        lookaheads = ()
    if not lookaheads or any(k < 1 for k in lookaheads) or (args.width is not None and args.width < 1):
        print(f"tandem: --lookahead takes whole numbers from 1, comma-separated, not {args.lookahead!r}; "
              f"--width a whole number from 1", file=sys.stderr)
        return 2
    if args.step_costs:
        from dataclasses import asdict

        from ..quality.bench import environment, write_report
        from ..quality.bench_shapes import step_costs

        costs = step_costs(args.shape, args.dtype, args.device, lookaheads[0], width=args.width)
        write_report({"environment": environment(args.device), "shape": args.shape, "lookahead": lookaheads[0],
                      "width": args.width, "step_costs": [asdict(c) for c in costs]}, args.json, print)
        return 0
    bench_shapes(args.shape, args.tokens, args.rows, acceptances, lookaheads, args.dtype, args.device,
                 args.assistant_layers, args.json, width=args.width, beam_size=args.beam_size)
    return 0


def cmd_bench_text(args: argparse.Namespace) -> int:
    from ..quality.bench_text import bench_text
    from ..quality.evaluation import task_of_set

    task = getattr(args, "task", None) or task_of_set(args.set)  # --task: the older spelling
    bench_text(task, args.pair, args.limit, args.max_new_tokens, args.json, device=args.device, dtype=args.dtype,
               peers=args.peers)
    return 0


def cmd_bench_scale(args: argparse.Namespace) -> int:
    from ..scale import require_ray
    from ..scale.bench import bench_scale

    require_ray()  # RayUnavailableError: exit 2 before anything runs
    actors = tuple(int(x) for x in args.actors.split(",") if x.strip())
    bench_scale(args.pair, args.set, args.limit, args.batch_size, actors, args.threads_per_actor, args.json)
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    from ..distill import DistillOptions, corpus_labelled, curve_options, distill
    from ..distill.options import parse_shards
    from ..paths import output_guard

    data = tuple(args.data) if args.data else ("debian-speech",)
    opts = DistillOptions(main=args.main, out=Path(args.out), layers=args.layers, init=args.init, data=data, clips=args.clips,
                          heldout=args.heldout, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                          draft_vocab=args.draft_vocab, budget_minutes=args.budget_minutes, resume=args.resume,
                          device=args.device, corpus=Path(args.corpus) if args.corpus else None,
                          label_only=args.label_only, steps=args.steps, curve=parse_sizes(args.curve),
                          drafter=args.drafter, heads=args.heads, shards=parse_shards(args.shards), start=args.start)
    keep = "what was finished is kept; free space and go on with the same command and --resume"
    with output_guard(opts.out, keep):
        folder = distill(opts)  # shards, checkpoints, the card: a full disk is one line (OutputWriteError)
    if folder is None and opts.label_only and corpus_labelled(curve_options(opts)):
        print(f"labelled: {opts.clips} training items and the held-out shard in {args.out}")
        return 0
    if folder is None:
        print(f"stopped at the budget; go on with: tandem distill ... --out {args.out} --resume")
        return 3
    if opts.drafter == "medusa":
        print(f"learning curve: {folder / 'curve.md'} (Medusa heads are measured, not exported)")
        return 0
    print(f"assistant: {folder} (see CARD.md there)")
    return 0


def parse_sizes(text: str | None) -> tuple[int, ...]:
    """--curve's comma-separated corpus sizes (DistillError, exit 2, for anything but positive integers)."""
    from ..distill import DistillError

    if not text:
        return ()
    try:
        sizes = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] <= 0:
        raise DistillError(f"--curve {text!r}: positive clip counts, comma-separated")
    return sizes


def cmd_regress(args: argparse.Namespace) -> int:
    from ..paths import PROJECT_ROOT, output_guard
    from ..quality.regress import accept, load_config, regress

    config = load_config(args.config or PROJECT_ROOT / "data" / "nightly.yaml")
    with output_guard(config.out):  # the history (SQLite) and the report: a full disk is one line
        if args.accept is not None:
            print(accept(config, args.accept))
            return 0
        run_id, findings, notes, report = regress(config, pin=args.pin, device=args.device)
    for line in notes:
        print(line, file=sys.stderr)
    for f in findings:
        print(f"REGRESSION: {f.line}", file=sys.stderr)
    print(f"run {run_id}: {'FAIL' if findings else 'PASS'}; report {report}")
    return 1 if findings else 0


def ui_command(port: int) -> list[str]:
    """The streamlit command line that serves ui/app.py on 127.0.0.1 (usage statistics off)."""
    from ..paths import PROJECT_ROOT

    return [sys.executable, "-m", "streamlit", "run", str(PROJECT_ROOT / "ui" / "app.py"),
            "--server.address", "127.0.0.1", "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false"]


def cmd_ui(args: argparse.Namespace) -> int:
    from ..devices import ENV as DEVICE_ENV
    from ..paths import PROJECT_ROOT

    env = dict(os.environ)  # main() has set TANDEM_MODELS from --models for this command's run
    env[DEVICE_ENV] = args.device  # resolved here: the app loads its models there
    print(f"Tandem UI on http://127.0.0.1:{args.port}, models on {args.device} (Ctrl-C stops it)")
    return serve(ui_command(args.port), cwd=PROJECT_ROOT / "ui", env=env)


def cmd_serve(args: argparse.Namespace) -> int:
    """``tandem serve``: the OpenAI-compatible server (pipelines/serve), options checked before anything loads."""
    from ..serve import ServeOptions, require_serve, run_server

    options = ServeOptions(host=args.host, port=args.port, asr_pair=args.pair, text_pair=args.text_model,
                           max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                           api_key=args.api_key or os.environ.get("TANDEM_API_KEY") or None,
                           max_upload_mb=args.max_upload_mb, device=args.device, dtype=args.dtype, models=args.models)
    require_serve()
    return run_server(options)


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
    from ..asr.options import TranscribeOptions
    from ..models.registry import load_registry
    from ..paths import display
    from ..quality.sets import MANIFEST, build_set, is_up_to_date, set_dir
    from .transcribe import first_use_line, run_transcribe

    if not is_up_to_date("speech-real"):
        print(f"building the sample set speech-real (pocketsphinx's test recordings, fetched with pip) into "
              f"{display(set_dir('speech-real'))} (first run only)...", file=sys.stderr)
    info = build_set("speech-real")
    print(f"sample audio: {info.count} real utterances in {info.folder / 'audio'}")
    if line := first_use_line(load_registry(args.models).default("asr")):
        print(line, file=sys.stderr)  # (not in transcribe: its refusals before any weights load are one line)
    options = TranscribeOptions(compare=True, batch_size=1, device=args.device)
    return run_transcribe([str(info.folder / "audio")], None, options, refs=str(info.folder / MANIFEST),
                          models=args.models)
