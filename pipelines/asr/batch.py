"""The batch job: files in, transcripts written under ``--out``, resumable, every file done or listed as failed.

plan      ``plan_batch`` expands the paths (``inputs.find_inputs``), opens the output folder (its lock, before
          any model loads) and decides what is left to do (``pending``: a file whose record says done with
          the same run signature is skipped)
decode    a source of Transcripts, one per pending file: ``transcribe_in_process`` (this process, the
          default) or ``pipelines.scale.ray_batch.transcribe_on_ray`` (a Ray actor pool)
record    ``run_batch`` writes each result as it arrives (``outputs.OutputTree.write``: outputs, then the
          record, atomically), appends the run's failures to ``failures.tsv`` and releases the folder
report    ``run_transcribe`` is the ``tandem transcribe`` command: progress bar, one line per file, summary

The decoding source is the only thing that differs between the in-process run and the Ray run: planning,
resume decisions and writing are these functions in both.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..devices import resolve_dtype
from ..errors import TandemError
from ..models.pairs import check_pair
from ..models.registry import Pair
from ..paths import OutputWriteError, advice_for
from .batching import transcribe
from .inputs import Skipped, display, find_inputs
from .options import TranscribeOptions, Transcript
from .outputs import OutputError, OutputTree, run_signature
from .runner import preflight_language, preflight_prompts
from .vad import require_vad

if TYPE_CHECKING:
    from ..scale.ray_batch import RayOptions


class BatchError(TandemError, ValueError):
    """The run cannot start (a missing input, no audio found, an unusable output folder): one sentence."""


@dataclass(frozen=True)
class BatchJob:
    """A planned run. ``tree`` is open (its lock held) until ``run_batch`` closes it."""

    pair: Pair
    options: TranscribeOptions
    files: tuple[Path, ...]  # every input found, in a stable order
    todo: tuple[Path, ...]  # the inputs not done before (all of them without an output folder)
    tree: OutputTree | None  # where outputs go, or None (nothing written)
    collisions: tuple[str, ...] = ()  # one line per output name that had to be disambiguated
    not_audio: tuple[Skipped, ...] = ()  # files of the folders given that are not audio (named in the summary)


@dataclass(frozen=True)
class BatchRun:
    """What a run did: one Transcript per file it decoded (failed ones have ``error`` set)."""

    results: tuple[Transcript, ...]
    skipped: int  # files done by an earlier run into the same folder
    wall: float  # seconds from the first decode to the last result
    interrupted: bool  # stopped by Ctrl-C (or an on_result that raised KeyboardInterrupt)

    @property
    def failed(self) -> tuple[Transcript, ...]:
        return tuple(r for r in self.results if not r.ok)


def pending(files: Iterable[Path], tree: OutputTree | None) -> tuple[Path, ...]:
    """The files a run still has to decode: all of them, less those whose record in ``tree`` says done."""
    return tuple(f for f in files if not (tree and f.exists() and tree.is_done(f)))


def plan_batch(paths: Iterable[str | os.PathLike], pair: Pair, options: TranscribeOptions, out: str | os.PathLike | None = None,
               formats: tuple[str, ...] = ("txt",)) -> BatchJob:
    """Expand ``paths`` (files, folders searched recursively, globs), open ``out`` and decide what is left.
    Raises BatchError before any model loads; the returned job holds the output folder's lock."""
    paths = [os.fspath(p) for p in paths]
    if wrong := pair.task_mismatch("asr"):
        raise BatchError(f"pair {pair.name!r} is {wrong}")
    missing = [p for p in paths if not any(ch in p for ch in "*?[") and not os.path.lexists(p)]
    if missing:
        raise BatchError(f"no such file or folder: {display(missing[0])}")
    inputs, collisions, not_audio = find_inputs(paths, exclude=[out] if out else [])
    if not inputs:
        raise BatchError("no audio files found in " + ", ".join(display(p) for p in paths)
                         + (f" ({skipped_line(not_audio)})" if not_audio else ""))
    tree = OutputTree(out, inputs, formats, run_signature(pair.name, options)) if out else None
    if tree:
        try:
            tree.open()
        except OutputError as e:
            raise BatchError(str(e)) from None
        try:
            tree.note_skipped(not_audio)
        except OutputWriteError as exc:
            tree.close()
            raise exc.advise(f"nothing was transcribed; {advice_for(exc.reason)} and run the same command",
                             tree.out) from None
    files = tuple(i.path for i in inputs)
    return BatchJob(pair, options, files, pending(files, tree), tree, tuple(collisions), tuple(not_audio))


def skipped_line(not_audio, where: str | None = None) -> str:
    """"skipped 3 files that are not audio: a.txt, b.jpg, c.pdf (see OUT/skipped.tsv)": the first names, then
    how many more."""
    names = [display(s.path.name) for s in not_audio[:5]]
    more = f" and {len(not_audio) - len(names)} more" if len(not_audio) > len(names) else ""
    noun = "file that is" if len(not_audio) == 1 else "files that are"
    return (f"skipped {len(not_audio)} {noun} not audio: {', '.join(names)}{more}"
            + (f" (see {where})" if where else ""))


def transcribe_in_process(job: BatchJob) -> Iterator[Transcript]:
    """Decode the job's pending files in this process (the pair loaded once), one Transcript per file."""
    return transcribe(job.todo, job.pair, job.options)


def run_batch(job: BatchJob, source: Iterable[Transcript] | None = None,
              on_result: Callable[[Transcript], None] | None = None) -> BatchRun:
    """Write each Transcript of ``source`` (default: ``transcribe_in_process(job)``) as it arrives, then
    append the failures to ``failures.tsv`` and release the output folder. Ctrl-C stops the run cleanly:
    what was written is kept and a second run resumes after it. An output that cannot be written (a full disk,
    a quota, a read-only or vanished folder) stops the run the same way and raises OutputWriteError: "no space
    left on OUT: 9 of 12 files finished and kept; free space and run the same command to resume"."""
    source = transcribe_in_process(job) if source is None else source
    results: list[Transcript] = []
    start = time.perf_counter()
    interrupted, lost, kept = False, None, len(job.files) - len(job.todo)
    try:
        for result in source:
            results.append(result)
            if job.tree:
                job.tree.write(result)  # outputs, then the record: a file cut short is redone by the next run
                kept += result.ok
            if on_result:
                on_result(result)
    except KeyboardInterrupt:
        interrupted = True
    except OutputWriteError as exc:
        lost = exc
    finally:
        close = getattr(source, "close", None)
        if close:
            close()  # a generator's cleanup (a Ray run shuts its actor pool down)
        failed = [r for r in results if not r.ok]
        if job.tree:
            try:
                if failed:
                    job.tree.add_failures(failed)
            except OutputWriteError as exc:
                lost = lost or exc
            finally:
                job.tree.close()
    if lost is not None:
        raise lost.advise(f"{kept} of {len(job.files)} files finished and kept; {advice_for(lost.reason)} and run "
                          "the same command to resume", job.tree.out) from None
    return BatchRun(tuple(results), len(job.files) - len(job.todo), time.perf_counter() - start, interrupted)


def transcribe_files(paths: Iterable[str | os.PathLike], pair: Pair, options: TranscribeOptions = TranscribeOptions(),
                     out: str | os.PathLike | None = None, formats: tuple[str, ...] = ("txt",),
                     ray: RayOptions | None = None, on_result: Callable[[Transcript], None] | None = None) -> BatchRun:
    """The batch job from Python: ``plan_batch`` then ``run_batch``, in this process or, with ``ray``
    (``pipelines.scale.RayOptions``), on a Ray actor pool. Raises BatchError before any model loads, and
    ``pipelines.scale.RayUnavailableError`` when ``ray`` is given but Ray is not installed."""
    job = plan_batch(paths, pair, options, out, formats)
    return run_batch(job, _source(job, ray), on_result)


def _source(job: BatchJob, ray: RayOptions | None) -> Iterable[Transcript] | None:
    if ray is None or not job.todo:
        return None
    from ..scale.ray_batch import transcribe_on_ray

    return transcribe_on_ray(job.todo, job.pair, job.options, ray)


# ----------------------------------------------------------------------------------------------------
# the command


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


def _options(language, task, dtype, use_assistant, compare, out, formats, batch_size, timestamps, long_form,
             lookahead, safeguards, device="cpu") -> TranscribeOptions:
    """The command's TranscribeOptions; ValueError with one sentence for a bad value."""
    from ..engine import parse_policy

    if batch_size < 1:
        raise ValueError(f"--batch-size must be 1 or more (got {batch_size})")
    return TranscribeOptions(language=None if language == "auto" else language, task=task, dtype=dtype, device=device,
                             use_assistant=use_assistant, policy=parse_policy(lookahead), **(safeguards or {}),
                             compare=compare, batch_size=batch_size, long_form=long_form,
                             timestamps=timestamps or any(f in ("srt", "vtt", "tsv") for f in (formats if out else ())))


def _mode(pair: Pair, options: TranscribeOptions, ray: RayOptions | None) -> str:
    if not pair.uses_assistant or not options.use_assistant:
        mode = "plain decoding" + ("" if options.use_assistant else " (--no-assistant)")
    else:
        mode = f"drafts from {pair.assistant or 'prompt lookup'}"
    dtype = resolve_dtype(options.device, options.dtype, pair.dtype)
    return (f"pair {pair.name}: {pair.main}, {mode}, {dtype} on {options.device}, batch {options.batch_size}"
            + (", long files in chunks" if options.long_form == "chunked" else "")
            + (f", on Ray ({ray.describe()})" if ray else ""))


def _progress(bar, start: float) -> Callable[[Transcript], None]:
    audio = [0.0]

    def show(result: Transcript) -> None:
        name = display(Path(result.path).name)
        cut = f"  [cut by the token limit in {result.cut} window(s): finish_reason length]" if result.cut else ""
        bar.write(f"{name}  [{result.duration:.1f} s audio]  {result.text}{cut}" if result.ok
                  else f"{name}  FAILED: {result.error}")
        audio[0] += result.duration
        bar.set_postfix(audio=f"{audio[0]:.0f}s", rtf=f"{(time.perf_counter() - start) / max(audio[0], 1e-9):.3f}")
        bar.update(1)

    return show


def summary_lines(run: BatchRun, job: BatchJob, refs: dict[str, str], out: str | None) -> list[str]:
    """The summary the command prints after a run (files, audio, wall time, acceptance, WER, ...)."""
    from ..quality.metrics import wer

    good = [r for r in run.results if r.ok]
    audio = sum(r.duration for r in good)
    lines = ["\nsummary" + (" (interrupted: finished files are kept; run again to resume)" if run.interrupted else ""),
             f"  files:           {len(run.results)} ({len(run.failed)} failed)"
             + (f", {run.skipped} skipped (done before)" if run.skipped else ""),
             f"  audio:           {audio:.1f} s",
             f"  wall time:       {run.wall:.1f} s (decoding {sum(r.seconds for r in good):.1f} s)"]
    if audio:
        lines.append(f"  real-time factor: {run.wall / audio:.3f} (wall / audio; below 1 is faster than real time)")
    drafted, accepted = sum(r.drafted for r in good), sum(r.accepted for r in good)
    calls, tokens = sum(r.main_calls for r in good), sum(r.tokens for r in good)
    if drafted:
        lines.append(f"  acceptance:      {accepted / drafted:.2f} of {drafted:.0f} drafts, "
                     f"{tokens / max(calls, 1e-9):.2f} tokens per main-model call")
    retried, skipped, dropped = (sum(getattr(r, k) for r in good) for k in ("retried", "skipped", "dropped"))
    if retried or skipped or dropped:
        lines.append(f"  safeguards:      {retried} windows decoded again hotter, {skipped} skipped as silence, "
                     f"{dropped} dropped (still repetitive or unlikely at the last temperature)")
    compared = [r for r in good if r.plain_seconds is not None]
    if compared:
        assisted_s = sum(r.decode_seconds for r in compared)
        plain_s = sum(r.plain_seconds for r in compared)
        same = sum(bool(r.identical) for r in compared)
        lines.append(f"  vs plain:        decoder {plain_s / max(assisted_s, 1e-9):.2f}x faster ({plain_s:.1f} s plain, "
                     f"{assisted_s:.1f} s assisted, encoder excluded), identical outputs {same}/{len(compared)}")
    scored = [(r.text, refs[Path(r.path).stem]) for r in good if Path(r.path).stem in refs]
    if scored:
        score = wer([h for h, _ in scored], [r for _, r in scored], language=job.options.language or "en")
        lines.append(f"  WER:             {100 * score.value:.2f}% on {score.n} files  [{score.signature}]")
    cut = [r for r in good if r.cut]
    if cut:
        lines.append(f"  cut:             {sum(r.cut for r in cut)} window(s) in {len(cut)} file(s) stopped at the "
                     "token limit before their end (finish_reason length in their json)")
    if job.not_audio:
        lines.append("  " + skipped_line(job.not_audio, display(Path(out) / "skipped.tsv") if job.tree else None))
    if run.failed and job.tree:
        lines.append(f"  failures:        {Path(out) / 'failures.tsv'}")
    return lines


def run_transcribe(paths: list[str], pair_name: str | None, language: str | None, task: str, dtype: str | None,
                   refs_manifest: str | None, models: str | None, use_assistant: bool = True,
                   compare: bool = False, out: str | None = None, formats: tuple[str, ...] = ("txt",),
                   batch_size: int = 4, timestamps: bool = False, quiet: bool = False,
                   long_form: str = "sequential", lookahead: str = "adaptive", safeguards: dict | None = None,
                   ray: RayOptions | None = None, device: str = "cpu") -> int:
    """``tandem transcribe``: plan, decode (in this process, or on Ray with ``ray``) on ``device`` ("cpu",
    "cuda:0": devices.resolve_device), print; the exit status (0 all done, 1 some failed, 130 interrupted).
    A run that cannot start raises a TandemError (BatchError for a bad option value or an unreachable Ray
    cluster), which the command prints (exit 2)."""
    from ..models.registry import load_registry

    registry = load_registry(models)
    pair = registry.get(pair_name) if pair_name else registry.default("asr")
    try:
        options = _options(language, task, dtype, use_assistant, compare, out, formats, batch_size, timestamps,
                           long_form, lookahead, safeguards, device)
    except ValueError as e:  # --batch-size, --lookahead, a safeguard's value
        raise BatchError(str(e)) from None
    if ray:
        from ..scale import require_ray

        require_ray()  # a missing extra is known before the output folder is taken
    require_vad(options.vad_filter)  # likewise
    refs = load_refs(refs_manifest)
    check_pair(pair)
    preflight_language(pair, options)
    preflight_prompts(pair, options)
    job = plan_batch(paths, pair, options, out, formats)
    try:
        return _report(job, ray, quiet, refs, out)
    except ConnectionError as e:  # ray.init: no cluster answers at the address given
        raise BatchError(f"cannot join the Ray cluster at {ray.address if ray else '?'}: {e}") from e


def _report(job: BatchJob, ray: RayOptions | None, quiet: bool, refs: dict[str, str], out: str | None) -> int:
    """Run the planned job with a progress bar and one line per file, then print the summary; the exit status."""
    from tqdm import tqdm

    for line in job.collisions:
        print(line)
    print(_mode(job.pair, job.options, ray))
    if job.tree and len(job.todo) < len(job.files):
        print(f"resuming: {len(job.files) - len(job.todo)} of {len(job.files)} files already done in {out}")
    bar = tqdm(total=len(job.todo), unit="file", disable=quiet or not job.todo, file=sys.stderr)
    try:
        run = run_batch(job, _source(job, ray), _progress(bar, time.perf_counter()))
    finally:
        bar.close()
    for line in summary_lines(run, job, refs, out):
        print(line)
    if run.interrupted:
        return 130
    return 1 if run.failed else 0
