"""Transcription with continuous batching (the server's): every file's windows are rows of the engine's
``ContinuousBatch``es, joining and leaving at the engine's round boundaries.

``batching.transcribe`` decodes a step at a time: one window of each file, all of them to the end, then the
next windows. A window that finished early waits for the step's longest, and a file that arrives mid-step
waits for the next one. Here, round after round:

    admit     files join (``admit(room)``, up to ``batch_size`` files at once), each opened as in ``transcribe``
    gather    each file without a window in flight gets its next window (``batching._gather``: silent windows
              skipped, the prompt built, the language detected where asked)
    join      the windows are encoded and join the running batch of their rules (timestamp mode, prompt length,
              forced prefix length: rows of a batch share the rules) in a free slot, or one it grows by; a key
              without a batch starts one
    step      every running batch decodes one round
    record    a window whose row finished goes through the safeguards (``safeguards.decide`` with that greedy
              decode as its first; a fallback samples the window alone, seeded, as ``transcribe``'s do) and
              ``batching.record_window``: segments, word timestamps, the file's next seek
    yield     a file whose last window is recorded is yielded at once

While no file waits for its rules (none between two windows of that timestamp mode, none queued), a batch with no
row left closes, and one whose rows have fallen to a quarter of its slots drops its empty slots
(``ContinuousBatch.compact``): a last long file then decodes at its own size.

Each window's decode is the same greedy decode ``transcribe`` makes (the engine's rows are independent: the
tests check transcripts against ``transcribe``'s), so the transcripts are too. ``supports`` says which options
decode this way: greedy first (the temperature schedule starting at 0), no beam search, sequential long form,
no ``--compare``; others go through ``transcribe``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..audio import SAMPLE_RATE
from ..engine import EncoderOutput
from ..engine.continuous import ContinuousBatch, Joiner
from ..models.registry import Pair
from .batching import _detect_languages, _gather, _Piece, record_window, window_seed
from .cursors import Cursor, account, finish, open_files, progress_of
from .inputs import find_audio
from .options import Progress, Segment, TranscribeOptions, Transcript
from .runner import WhisperRunner, check_prompts
from .safeguards import decide
from .vad import require_vad

RulesKey = tuple[bool, int, int]  # timestamp mode, prompt length, forced prefix length


def supports(options: TranscribeOptions) -> bool:
    """Whether ``options`` decode through continuous batches (module docstring)."""
    return (options.temperature[0] == 0 and options.beam_size is None and options.long_form != "chunked"
            and not options.compare)


@dataclass(frozen=True)
class _Flying:
    """A window decoding as a batch row: its piece, its encoder output (1, S, D) and rules key, and its share
    of the encoder pass's seconds."""

    piece: _Piece
    enc: EncoderOutput
    key: RulesKey
    encode_s: float


class _Batches:
    """The running ``ContinuousBatch`` of each rules key, and the windows in them (by ``id`` of their piece)."""

    def __init__(self, runner: WhisperRunner, options: TranscribeOptions) -> None:
        self.runner, self.options = runner, options
        self.by_key: dict[RulesKey, ContinuousBatch] = {}
        self.flying: dict[int, _Flying] = {}

    def busy(self, cur: Cursor) -> bool:
        """Whether ``cur`` has a window in flight."""
        return any(f.piece.cursor is cur for f in self.flying.values())

    def join(self, pieces: list[_Piece]) -> None:
        """Encode ``pieces`` (one encoder pass per rules key) and give each a slot in its key's batch: a free one,
        else one the batch grows by; a key without a batch starts one."""
        groups: dict[RulesKey, list[_Piece]] = {}
        for p in pieces:
            groups.setdefault((not p.cursor.single, len(p.prompt), len(p.forced)), []).append(p)
        runner, options = self.runner, self.options
        for key, items in groups.items():
            enc, encode_s = runner.encode_windows([p.span for p in items], [p.encoded for p in items])
            joiners = []
            for row, p in enumerate(items):
                one = EncoderOutput(enc.hidden[row : row + 1], None if enc.mask is None else enc.mask[row : row + 1])
                self.flying[id(p)] = _Flying(p, one, key, encode_s / len(items))
                joiners.append(Joiner(id(p), tuple(p.prompt), one))
            batch = self.by_key.get(key)
            if batch is None:
                rules, decoding = runner.decoding(items[0].prompt, key[0], options,
                                                  no_speech=options.no_speech_threshold is not None)
                self.by_key[key] = ContinuousBatch(runner.engine_for(options), rules, decoding, len(joiners), joiners,
                                                   shape_rows=max(1, options.batch_size))
                continue
            batch.grow(len(joiners) - batch.free)
            batch.join(joiners)

    def step(self) -> list[tuple[_Flying, object]]:
        """One round of every batch; the windows that finished, with their one-row DecodeResult."""
        return [(self.flying.pop(k), result) for batch in self.by_key.values() for k, result in batch.step()]

    def tidy(self, waiting: Callable[[RulesKey], bool]) -> None:
        """Unless a window of their key may join soon (``waiting(key)``): close the batches with no row, and
        compact those at a quarter of their slots or less."""
        for key, batch in list(self.by_key.items()):
            if waiting(key):
                continue
            if not batch.live:
                batch.close()
                del self.by_key[key]
            elif 4 * batch.live <= batch.slots:
                batch.compact()

    def cancel(self, cur: Cursor) -> None:
        """Stop ``cur``'s window in flight, if any (its slot freed)."""
        for k, f in list(self.flying.items()):
            if f.piece.cursor is cur:
                self.by_key[f.key].cancel(k)
                del self.flying[k]

    def close(self) -> None:
        for batch in self.by_key.values():
            batch.close()
        self.by_key.clear()


def _record(runner: WhisperRunner, flying: _Flying, result, options: TranscribeOptions) -> None:
    """A finished row's window through the safeguards and into its file (module docstring: record)."""
    piece, cur = flying.piece, flying.piece.cursor
    timestamps = not cur.single
    verdicts, calls = decide(runner, flying.enc, [piece.prompt], timestamps, options,
                             [window_seed(piece.audio, piece.start)], first=result)
    for _, call in calls:
        account(cur, call, 0, 1.0)
        cur.hist.update(call.stats.accepted_hist)
    cur.seconds += flying.encode_s
    record_window(runner, piece, verdicts[0], flying.enc.hidden[0], timestamps, options)
    cur.done = cur.at_end()


def transcribe_continuously(paths: Iterable[str | Path], pair: Pair, options: TranscribeOptions = TranscribeOptions(),
                            runner: WhisperRunner | None = None,
                            progress: Callable[[Progress], None] | None = None,
                            admit: Callable[[int], list[Path]] | None = None,
                            watch: Callable[[str, tuple[Segment, ...]], bool] | None = None) -> Iterator[Transcript]:
    """``batching.transcribe``'s contract (the same arguments, Transcripts, errors and hooks), decoded with
    continuous batching (module docstring): ``admit`` is asked at every round for up to ``room`` more files,
    ``watch`` told at every round each file's new segments (False drops the file: its row leaves the batch),
    ``progress`` called after every round. ValueError for options ``supports`` refuses."""
    if not supports(options):
        raise ValueError("continuous batching decodes greedily first, without beam search, chunked long form or compare")
    require_vad(options.vad_filter)  # before any model loads
    runner = runner or WhisperRunner(pair, options.dtype, options.device)
    runner.check_language(options)
    check_prompts(runner.tokenizer, options)
    room = max(1, options.batch_size)
    queue = list(find_audio(paths))
    active: list[Cursor] = []
    batches = _Batches(runner, options)
    begun, windows, files_done, finished_audio = time.perf_counter(), 0, 0, 0.0
    try:
        while True:
            if admit is not None and len(queue) + len(active) < room:
                queue += admit(room - len(queue) - len(active))
            if not (queue or active):
                break
            yield from open_files(queue, active, options, runner)
            before = {id(c): len(c.segments) for c in active}
            idle = [c for c in active if not c.done and not batches.busy(c)]
            work = _gather(runner, idle, options) if idle else {True: [], False: []}
            _detect_languages(runner, work, options)
            pieces = work[True] + work[False]
            if pieces:
                batches.join(pieces)
            for cur in idle:  # a file read to its end with no window in flight is done
                if not batches.busy(cur):
                    cur.done = cur.at_end()
            for flying, result in batches.step():
                _record(runner, flying, result, options)
                windows += 1
            # a key's batch keeps its slots while a file of its timestamp mode is between windows (or queued)
            batches.tidy(lambda key: bool(queue) or any(not c.done and not batches.busy(c) and (not c.single) == key[0]
                                                        for c in active))
            if watch is not None:
                for cur in [c for c in active if not watch(str(c.path), tuple(c.segments[before[id(c)]:]))]:
                    batches.cancel(cur)
                    active.remove(cur)
            finished = [c for c in active if c.done and not batches.busy(c)]
            for cur in finished:
                files_done += 1
                finished_audio += cur.reader.known_length / SAMPLE_RATE
            if progress is not None:
                progress(progress_of(windows, files_done, finished_audio, [c for c in active if c not in finished],
                                     time.perf_counter() - begun))
            for cur in finished:
                active.remove(cur)
                yield finish(cur, False)
    finally:
        batches.close()
