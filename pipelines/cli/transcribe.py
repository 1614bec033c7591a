"""``tandem transcribe`` (and ``tandem demo``): the options built once from the command line, the batch job
(``asr.batch``) run with a progress bar and one line per file, and the summary printed. The library below
never prints; this is where the command's output is made."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..asr.batch import BatchError, BatchJob, BatchRun, plan_batch, run_batch, skipped_line, source_for
from ..asr.inputs import display
from ..asr.options import TranscribeOptions, Transcript
from ..asr.outputs import FORMATS, TIMED
from ..asr.runner import preflight_language, preflight_prompts
from ..asr.subtitles import SubtitleOptions
from ..asr.vad import require_vad
from ..devices import resolve_dtype
from ..models.pairs import check_pair
from ..models.registry import Pair, load_registry
from ..scale import RayOptions

if TYPE_CHECKING:
    from ..engine import AssistedDecoder


def output_formats(text: str, out: str | None = None) -> tuple[str, ...]:
    """``-f txt,srt`` as a tuple of formats (``all``: every one, as whisper's ``--output_format all``);
    BatchError naming an unknown one, or formats other than txt without an output folder ``out`` (``-o``):
    only there are files written (without it the transcripts are printed), so they would be dropped in
    silence."""
    formats = tuple(f.strip().lower() for f in text.split(",") if f.strip())
    formats = FORMATS if formats == ("all",) else formats
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise BatchError(f"unknown format {bad[0]!r}; choose from {', '.join(FORMATS)}, or all")
    if not out and set(formats) - {"txt"}:
        raise BatchError(f"-f {text} writes files: give -o DIR too (without -o the transcripts are printed as text)")
    return formats


def transcribe_options(args: argparse.Namespace, formats: tuple[str, ...]) -> TranscribeOptions:
    """The command line's TranscribeOptions, built once (TranscribeOptions validates); BatchError with its
    sentence for a bad value."""
    from ..engine import parse_policy

    try:
        return TranscribeOptions(
            language=None if args.language == "auto" else args.language, task=args.task, dtype=args.dtype,
            device=args.device, use_assistant=not args.no_assistant, compare=args.compare,
            batch_size=args.batch_size, long_form=args.long_form, policy=parse_policy(args.lookahead),
            timestamps=args.timestamps or bool(args.out) and any(f in TIMED for f in formats),
            temperature=args.temperature, compression_ratio_threshold=args.compression_ratio_threshold,
            logprob_threshold=args.logprob_threshold, no_speech_threshold=args.no_speech_threshold,
            vad_filter=args.vad_filter, initial_prompt=args.initial_prompt, hotwords=args.hotwords, prefix=args.prefix,
            condition_on_previous_text=args.condition_on_previous_text,
            prompt_reset_on_temperature=args.prompt_reset_on_temperature, audio_track=args.audio_track,
            word_timestamps=args.word_timestamps, prepend_punctuations=args.prepend_punctuations,
            append_punctuations=args.append_punctuations, beam_size=args.beam_size, patience=args.patience,
            length_penalty=args.length_penalty, best_of=args.best_of)
    except ValueError as e:  # --lookahead, a safeguard's value, a combination
        raise BatchError(str(e)) from None


def subtitle_options(args: argparse.Namespace) -> SubtitleOptions:
    """``--highlight-words`` and the line options (whisper's); BatchError, as whisper's command line refuses,
    when they are given without what they need."""
    subtitles = SubtitleOptions(args.highlight_words, args.max_line_width, args.max_line_count, args.max_words_per_line)
    if subtitles.any and not args.word_timestamps:
        raise BatchError("--highlight-words and --max-line-width/-count/--max-words-per-line need --word-timestamps")
    if args.max_line_count is not None and args.max_line_width is None:
        raise BatchError("--max-line-count needs --max-line-width")
    return subtitles


def ray_options(args: argparse.Namespace) -> RayOptions | None:
    """``--ray`` and its options, or None; BatchError for a bad value."""
    if args.ray is None:
        return None
    try:
        return RayOptions(address=args.ray, actors=args.actors, threads_per_actor=args.threads_per_actor,
                          files_per_task=args.files_per_task)
    except ValueError as e:
        raise BatchError(str(e)) from None


def run_transcribe(paths: list[str], pair_name: str | None, options: TranscribeOptions, *, refs: str | None = None,
                   models: str | None = None, out: str | None = None, formats: tuple[str, ...] = ("txt",),
                   ray: RayOptions | None = None, quiet: bool = False,
                   subtitles: SubtitleOptions = SubtitleOptions(), force: bool = False) -> int:
    """``tandem transcribe``: check everything that can be checked before a model loads, plan, decode (in
    this process, or on Ray with ``ray``), print; the exit status (0 all done, 1 some failed, 130
    interrupted). A run that cannot start raises a TandemError, which the command prints; ``force``: redo
    and overwrite transcripts in ``out`` made with another pair or other options (refused otherwise)."""
    registry = load_registry(models)
    pair = registry.get(pair_name) if pair_name else registry.default("asr")
    if ray:
        from ..scale import require_ray

        require_ray()  # a missing extra is known before the output folder is taken
    require_vad(options.vad_filter)  # likewise
    references = load_refs(refs)
    check_pair(pair)
    preflight_language(pair, options)
    preflight_prompts(pair, options)
    job = plan_batch(paths, pair, options, out, formats, subtitles, force=force)
    try:
        return _report(job, ray, quiet, references, out)
    except ConnectionError as e:  # ray.init: no cluster answers at the address given
        raise BatchError(f"cannot join the Ray cluster at {ray.address if ray else '?'}: {e}") from e


def load_refs(manifest: str | None) -> dict[str, str]:
    """Reference texts keyed by audio file stem (and by item id), from ``manifest``: a manifest.jsonl file (one
    JSON object a line with ``id``, ``reference`` and optionally ``audio``), a folder holding one, or a built set's
    name. BatchError naming the manifest when it is missing, not JSON lines or lacks those keys; read before
    anything loads, so a bad --refs costs no transcription."""
    if not manifest:
        return {}
    import json

    from ..quality.sets import MANIFEST, DataBuildError, read_manifest

    path = Path(manifest)
    try:
        items = read_manifest(path / MANIFEST if path.is_dir() else manifest)
    except DataBuildError as exc:
        raise BatchError(f"--refs {manifest}: no such manifest file or set ({exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BatchError(f"--refs {manifest}: not a manifest of JSON lines ({exc})") from None
    except OSError as exc:
        raise BatchError(f"--refs {manifest}: cannot be read ({exc.strerror or exc})") from None
    refs = {}
    for n, item in enumerate(items, 1):
        if not isinstance(item, dict) or not isinstance(item.get("reference"), str) or "id" not in item:
            raise BatchError(f"--refs {manifest}: item {n} is not an object with 'id' and 'reference' (text)")
        refs[str(item["id"])] = item["reference"]
        if "audio" in item:
            refs[Path(item["audio"]).stem] = item["reference"]
    return refs


def describe_mode(pair: Pair, options: TranscribeOptions, ray: RayOptions | None) -> str:
    if not pair.uses_assistant or not options.use_assistant:
        mode = "plain decoding" + ("" if options.use_assistant else " (--no-assistant)")
    else:
        mode = f"drafts from {pair.assistant or 'prompt lookup'}"
    dtype = resolve_dtype(options.device, options.dtype, pair.dtype)
    return (f"pair {pair.name}: {pair.main}, {mode}, {dtype} on {options.device}, batch {options.batch_size}"
            + (", long files in chunks" if options.long_form == "chunked" else "")
            + (f", on Ray ({ray.describe()})" if ray else ""))


def first_use_line(pair: Pair) -> str | None:
    """"converting the embedded Whisper weights (whisper-base, ...) into DIR (first run only)...": what the first
    run of ``pair`` does before its models load, or None when the cache holds its embedded models converted
    (``embedded.is_built``)."""
    from ..models.embedded import is_built
    from ..paths import models_dir

    refs = [r for r in (pair.main, pair.assistant) if r is not None and r.source == "embedded"]
    names = [r.id for r in refs if not is_built(r.id)]
    if not names:
        return None
    return (f"converting the embedded Whisper weights ({', '.join(names)}) into {display(models_dir())} "
            "(first run only)...")


def _progress(bar, start: float) -> Callable[[Transcript], None]:
    audio = [0.0]

    def show(result: Transcript) -> None:
        name = display(Path(result.path).name)
        cut = f"  [cut by the token limit in {result.cut} window(s): finish_reason length]" if result.cut else ""
        cut += f"  [{result.audio_note}]" if result.audio_note else ""
        bar.write(f"{name}  [{result.duration:.1f} s audio]  {result.text}{cut}" if result.ok
                  else f"{name}  FAILED: {result.error}")
        audio[0] += result.duration
        rtf = {"rtf": f"{(time.perf_counter() - start) / audio[0]:.3f}"} if audio[0] else {}  # none before any audio
        bar.set_postfix(audio=f"{audio[0]:.0f}s", **rtf)
        bar.update(1)

    return show


def decode_here(job: BatchJob, engines: list[AssistedDecoder]) -> Iterator[Transcript]:
    """The job's pending files decoded in this process, as ``asr.batch.transcribe_in_process`` does (the pair
    loaded when the first file is asked for), the drafting engine appended to ``engines`` so that the summary
    can say what its lookahead policy decided (``drafting_lines``)."""
    from ..asr.batching import WhisperRunner, transcribe  # (batching's names: tests patch them there)

    if not job.todo:
        return
    runner = WhisperRunner(job.pair, job.options.dtype, job.options.device)
    if job.options.use_assistant:
        engines.append(runner.loaded.engine)
    yield from transcribe(job.todo, job.pair, job.options, runner)


def drafting_lines(engines: list[AssistedDecoder]) -> list[str]:
    """When the adaptive lookahead policy stopped drafting (its measured gain over plain decoding fell below 1:
    ``policies.Adaptive``), one line per kind of decoding (greedy, beam search) and batch-size bucket:
    "assistant: drafting stopped after round 4 (drafts did not pay at these shapes); 57 of 60 rounds plain,
    probing now and then", or, when a later probe paid, that it drafted again. Rounds count every
    request's, in order, since the pair loaded."""
    lines = []
    for engine in engines:
        for memory, kind in ((engine.costs, ""), (engine.beam_costs, "beam search: ")):
            stopped = {rows: c for rows, c in sorted(memory.buckets.items()) if c.stopped_at is not None}
            for rows, c in stopped.items():
                batch = f"batches of up to {rows} rows: " if len(memory.buckets) > 1 else ""
                tail = (f"{c.plain_rounds} of {c.rounds} rounds plain, probing now and then" if c.drafting_off else
                        f"a later probe paid and it drafted again; {c.plain_rounds} of {c.rounds} rounds plain")
                lines.append(f"  assistant:       {kind}{batch}drafting stopped after round {c.stopped_at} (drafts "
                             f"did not pay at these shapes); {tail}")
    return lines


def summary_lines(run: BatchRun, job: BatchJob, refs: dict[str, str], out: str | None,
                  engines: list[AssistedDecoder] = ()) -> list[str]:
    """The summary the command prints after a run (files, audio, wall time, acceptance, WER, ...);
    ``engines``: the run's drafting engine, whose lookahead policy the summary reports (``drafting_lines``)."""
    from ..quality.metrics import wer

    good = [r for r in run.results if r.ok]
    audio = sum(r.duration for r in good)
    lines = ["\nsummary" + (" (interrupted: finished files are kept; run again to resume)" if run.interrupted else ""),
             f"  files:           {len(run.results)} ({len(run.failed)} failed)"
             + (f", {run.skipped} skipped (done before)" if run.skipped else "")]
    if run.filled:
        lines.append(f"  from records:    {filled_line(run.filled)}")
    lines += [f"  decoded again:   {line}" for line in again_lines(job.again)]
    lines += [f"  audio:           {audio:.1f} s",
              f"  wall time:       {run.wall:.1f} s (decoding {sum(r.seconds for r in good):.1f} s)"]
    if audio:
        lines.append(f"  real-time factor: {run.wall / audio:.3f} (wall / audio; below 1 is faster than real time)")
    drafted, accepted = sum(r.drafted for r in good), sum(r.accepted for r in good)
    calls, tokens = sum(r.main_calls for r in good), sum(r.tokens for r in good)
    if drafted:
        lines.append(f"  acceptance:      {accepted / drafted:.2f} of {drafted:.0f} drafts, "
                     f"{tokens / max(calls, 1e-9):.2f} tokens per main-model call")
    lines += drafting_lines(list(engines))
    retried, skipped, dropped = (sum(getattr(r, k) for r in good) for k in ("retried", "skipped", "dropped"))
    if retried or skipped or dropped:
        lines.append(f"  safeguards:      {retried} windows decoded again hotter, {skipped} skipped as silence, "
                     f"{dropped} dropped (still repetitive or unlikely at the last temperature)")
    if dropped:
        lines.append(f"  dropped:         {dropped_line(good)}")
    compared = [r for r in good if r.plain_seconds is not None]
    if compared:
        assisted_s = sum(r.decode_seconds for r in compared)
        plain_s = sum(r.plain_seconds for r in compared)
        same = sum(bool(r.identical) for r in compared)
        hotter = sum(r.retried for r in compared)  # sampled: compared in distribution (speculative sampling), not draws
        lines.append(f"  vs plain:        decoder {plain_s / max(assisted_s, 1e-9):.2f}x faster ({plain_s:.1f} s plain, "
                     f"{assisted_s:.1f} s assisted, encoder excluded), identical outputs {same}/{len(compared)}"
                     + (f" at temperature 0 (the {hotter} windows sampled hotter keep the main model's distribution, "
                        "not its draws: their text may differ from a run without the assistant)" if hotter else ""))
    scored = [(r.text, refs[Path(r.path).stem]) for r in good if Path(r.path).stem in refs]
    if scored:
        score = wer([h for h, _ in scored], [r for _, r in scored], language=job.options.language or "en")
        lines.append(f"  WER:             {100 * score.value:.2f}% on {score.n} files  [{score.signature}]")
    cut = [r for r in good if r.cut]
    if cut:
        lines.append(f"  cut:             {sum(r.cut for r in cut)} window(s) in {len(cut)} file(s) stopped at the "
                     "token limit before their end (finish_reason length in their json)")
    lines += audio_lines(good)
    if job.not_audio:
        lines.append("  " + skipped_line(job.not_audio, display(Path(out) / "skipped.tsv") if job.tree else None))
    if run.failed and job.tree:
        lines.append(f"  failures:        {Path(out) / 'failures.tsv'}")
    return lines


def filled_line(filled, verb: str = "wrote") -> str:
    """"3 files: wrote srt from stored results (no decoding)": the formats written from the records."""
    formats = ", ".join(dict.fromkeys(f for _, fmts in filled for f in fmts))
    return f"{len(filled)} file{'s' if len(filled) > 1 else ''}: {verb} {formats} from stored results (no decoding)"


def again_lines(again: tuple[tuple[Path, str], ...]) -> list[str]:
    """Why files done before are decoded again, one line per reason: "2 files (e.g. a.wav): srt needs
    timestamps, ..."."""
    why: dict[str, list[Path]] = {}
    for path, reason in again:
        why.setdefault(reason, []).append(path)
    return [f"{len(paths)} file{'s' if len(paths) > 1 else ''} (e.g. {display(paths[0].name)}): {reason}"
            for reason, paths in why.items()]


def dropped_line(good: list[Transcript]) -> str:
    """The windows the safeguards dropped, named: "talk.wav 30.00-60.00 s (repetitive: compression ratio
    3.10 > 2.4 at temperature 1.0)", the first five, then how many more (every one is in its file's json)."""
    named = [f"{display(Path(r.path).name)} {w.start:.2f}-{w.end:.2f} s ({w.reason})"
             for r in good for w in r.dropped_windows]
    more = f" and {len(named) - 5} more" if len(named) > 5 else ""
    return "; ".join(named[:5]) + more + " (dropped_windows in their json)"


def audio_lines(good: list[Transcript]) -> list[str]:
    """The summary's lines on the audio itself: the files decoded only in part (damaged or truncated, with the
    seconds recovered), and the files of several audio tracks (which one was read)."""
    lines = []
    named = lambda rs, say: ", ".join(f"{display(Path(r.path).name)} ({say(r)})" for r in rs[:5]) + (  # noqa: E731
        f" and {len(rs) - 5} more" if len(rs) > 5 else "")
    damaged = [r for r in good if r.damaged]
    if damaged:
        say = lambda r: f"{'truncated' if r.truncated else 'damaged'}, {r.seconds_recovered or 0:.1f} s recovered"  # noqa: E731
        lines.append(f"  damaged:         {len(damaged)} file(s) decoded as far as they go: {named(damaged, say)}"
                     " (decode_warnings in their json)")
    tracks = [r for r in good if r.audio_track is not None]
    if tracks:
        lines.append(f"  audio tracks:    {named(tracks, lambda r: f'{r.audio_tracks} audio tracks: {r.audio_track} read')}"
                     "; --audio-track N reads another (0-based)")
    return lines


def _report(job: BatchJob, ray: RayOptions | None, quiet: bool, refs: dict[str, str], out: str | None) -> int:
    """Run the planned job with a progress bar and one line per file, then print the summary; the exit status."""
    from tqdm import tqdm

    for line in job.collisions:
        print(line)
    print(describe_mode(job.pair, job.options, ray))
    done = len(job.files) - len(job.todo) - len(job.fills)
    if job.tree and done:
        print(f"resuming: {done} of {len(job.files)} files already done in {out}")
    if job.fills:
        print(filled_line(job.fills, "writing"))
    for line in again_lines(job.again):
        print(f"decoding again: {line}")
    if job.todo and not quiet and not ray:  # the bar stays at 0 until the pair is loaded and a file decoded
        print("loading the models...", file=sys.stderr)
    bar = tqdm(total=len(job.todo), unit="file", disable=quiet or not job.todo, file=sys.stderr)
    engines: list[AssistedDecoder] = []
    try:
        run = run_batch(job, source_for(job, ray) if ray else decode_here(job, engines),
                        _progress(bar, time.perf_counter()))
    finally:
        bar.close()
    for line in summary_lines(run, job, refs, out, engines):
        print(line)
    if run.interrupted:
        return 130
    return 1 if run.failed else 0
