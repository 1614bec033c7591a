"""The batch job: files in, transcripts written under ``--out``, resumable, every file done or listed as failed.

plan      ``plan_batch`` expands the paths (``inputs.find_inputs``), opens the output folder (its lock, before
          any model loads) and decides what is left to do from each file's record (``OutputTree.plan``): done
          (skipped), formats to write from the stored result (``fills``: no decoding), or decode (``todo``;
          ``again``: decoded before, and why that result does not serve)
decode    a source of Transcripts, one per pending file: ``transcribe_in_process`` (this process, the
          default) or ``pipelines.scale.ray_batch.transcribe_on_ray`` (a Ray actor pool)
record    ``run_batch`` writes the fills, then each result as it arrives (``outputs.OutputTree.write``:
          outputs, then the record, atomically), appends the run's failures to ``failures.tsv`` and releases the folder

The command's printing (progress bar, one line per file, summary) is ``pipelines.cli.transcribe``'s.

The decoding source is the only thing that differs between the in-process run and the Ray run: planning,
resume decisions and writing are these functions in both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TandemError
from ..models.registry import Pair
from ..paths import OutputWriteError, advice_for
from .batching import transcribe
from .inputs import Skipped, display, find_inputs
from .options import TranscribeOptions, Transcript
from .outputs import OutputError, OutputTree, Plan, run_signature
from .subtitles import SubtitleOptions

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
    fills: tuple[tuple[Path, tuple[str, ...]], ...] = ()  # done before: formats to write from the stored result
    again: tuple[tuple[Path, str], ...] = ()  # in todo: done before, and why that result cannot give the formats


@dataclass(frozen=True)
class BatchRun:
    """What a run did: one Transcript per file it decoded (failed ones have ``error`` set)."""

    results: tuple[Transcript, ...]
    skipped: int  # files done by an earlier run into the same folder
    wall: float  # seconds from the first decode to the last result
    interrupted: bool  # stopped by Ctrl-C (or an on_result that raised KeyboardInterrupt)
    filled: tuple[tuple[Path, tuple[str, ...]], ...] = ()  # formats written from stored results, no decoding

    @property
    def failed(self) -> tuple[Transcript, ...]:
        return tuple(r for r in self.results if not r.ok)


def plans(files: Iterable[Path], tree: OutputTree | None) -> dict[Path, Plan]:
    """Each file's plan from its record in ``tree`` (``OutputTree.plan``); "decode" for all without one."""
    return {f: tree.plan(f) if tree and f.exists() else Plan("decode") for f in files}


def plan_batch(paths: Iterable[str | os.PathLike], pair: Pair, options: TranscribeOptions, out: str | os.PathLike | None = None,
               formats: tuple[str, ...] = ("txt",), subtitles: SubtitleOptions = SubtitleOptions(),
               force: bool = False) -> BatchJob:
    """Expand ``paths`` (files, folders searched recursively, globs), open ``out`` and decide what is left.
    Raises BatchError before any model loads, also when ``out`` holds transcripts of these files made with
    another pair or other options, which the run would overwrite (``force``: redo them); the returned job
    holds the output folder's lock."""
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
    files = tuple(i.path for i in inputs)
    tree = (OutputTree(out, inputs, formats, run_signature(pair.name, options, subtitles), subtitles, pair.name,
                       options) if out else None)
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
    planned = plans(files, tree)
    others = [(f, p.pair) for f, p in planned.items() if p.action == "other" and not force]
    if others:
        tree.close()
        raise BatchError(overwrite_line(others, out, pair.name))
    todo = tuple(f for f, p in planned.items() if p.action not in ("done", "fill"))
    fills = tuple((f, p.missing) for f, p in planned.items() if p.action == "fill")
    again = tuple((f, p.why) for f, p in planned.items() if p.action == "again")
    return BatchJob(pair, options, files, todo, tree, tuple(collisions), tuple(not_audio), fills, again)


def overwrite_line(others: list[tuple[Path, str | None]], out, pair_name: str) -> str:
    """"OUT holds 3 transcripts made with pair whisper-base; this run (pair ...) would overwrite them: ..."."""
    made = sorted({f"pair {p}" if p and p != pair_name else "other decoding options" if p else "earlier settings"
                   for _, p in others})
    n = len(others)
    return (f"{display(out)} holds {n} transcript{'s' if n > 1 else ''} of these files made with {' and '.join(made)}"
            f" (e.g. {display(others[0][0].name)}); this run (pair {pair_name}) would overwrite "
            f"{'them' if n > 1 else 'it'}: add --force to redo {'them' if n > 1 else 'it'}, or choose another "
            "--output-dir")


def skipped_line(not_audio, where: str | None = None) -> str:
    """"skipped 3 files that are not audio: a.txt, b.jpg, c.pdf (see OUT/skipped.tsv)": the first names, then
    how many more."""
    names = [display(s.path.name) for s in not_audio[:5]]
    more = f" and {len(not_audio) - len(names)} more" if len(not_audio) > len(names) else ""
    noun = "file that is" if len(not_audio) == 1 else "files that are"
    return (f"skipped {len(not_audio)} {noun} not audio: {', '.join(names)}{more}"
            + (f" (see {where})" if where else ""))


def transcribe_in_process(job: BatchJob) -> Iterator[Transcript]:
    """Decode the job's pending files in this process (the pair loaded once, and not at all when nothing is
    left to decode), one Transcript per file."""
    return transcribe(job.todo, job.pair, job.options) if job.todo else iter(())


def run_batch(job: BatchJob, source: Iterable[Transcript] | None = None,
              on_result: Callable[[Transcript], None] | None = None) -> BatchRun:
    """Write the formats ``job.fills`` takes from the records (no decoding), then each Transcript of ``source``
    (default: ``transcribe_in_process(job)``) as it arrives, then
    append the failures to ``failures.tsv`` and release the output folder. Ctrl-C stops the run cleanly:
    what was written is kept and a second run resumes after it. An output that cannot be written (a full disk,
    a quota, a read-only or vanished folder) stops the run the same way and raises OutputWriteError: "no space
    left on OUT: 9 of 12 files finished and kept; free space and run the same command to resume"."""
    source = transcribe_in_process(job) if source is None else source
    results: list[Transcript] = []
    filled: list[tuple[Path, tuple[str, ...]]] = []
    start = time.perf_counter()
    interrupted, lost, kept = False, None, len(job.files) - len(job.todo)
    try:
        for path, formats in job.fills:  # no decoding: the records keep the results
            job.tree.fill(path, formats)
            filled.append((path, formats))
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
    return BatchRun(tuple(results), len(job.files) - len(job.todo) - len(job.fills), time.perf_counter() - start,
                    interrupted, tuple(filled))


def transcribe_files(paths: Iterable[str | os.PathLike], pair: Pair, options: TranscribeOptions = TranscribeOptions(),
                     out: str | os.PathLike | None = None, formats: tuple[str, ...] = ("txt",),
                     ray: RayOptions | None = None, on_result: Callable[[Transcript], None] | None = None,
                     force: bool = False) -> BatchRun:
    """The batch job from Python: ``plan_batch`` then ``run_batch``, in this process or, with ``ray``
    (``pipelines.scale.RayOptions``), on a Ray actor pool. Raises BatchError before any model loads, and
    ``pipelines.scale.RayUnavailableError`` when ``ray`` is given but Ray is not installed; ``force``: redo
    transcripts in ``out`` made with another pair or other options instead of refusing."""
    job = plan_batch(paths, pair, options, out, formats, force=force)
    return run_batch(job, source_for(job, ray), on_result)


def source_for(job: BatchJob, ray: RayOptions | None) -> Iterable[Transcript] | None:
    if ray is None or not job.todo:
        return None
    from ..scale.ray_batch import transcribe_on_ray

    return transcribe_on_ray(job.todo, job.pair, job.options, ray)
