"""A transcript kept in its per-file record (``OUT/<name>.tandem.json``), so that another output format can be
written later without decoding the file again: ``result_data`` (the json format's fields) and
``transcript_from_data`` (the Transcript back, equal field for field, so each writer gives what it gave).

JSON round-trips what a Transcript holds: floats exactly (Python writes the shortest repr that reads back to
the same float), tuples as lists, ``accepted_hist``'s int keys as strings; ``transcript_from_data`` turns
them back.
"""

from __future__ import annotations

from dataclasses import asdict, fields

from ..paths import display
from .options import WINDOW_SECONDS, DroppedWindow, Segment, TranscribeOptions, Transcript, Word


def result_data(t: Transcript) -> dict:
    """``t`` as JSON-ready data (the json format's: ``path`` as printable text, segments without an empty
    ``words``)."""
    data = asdict(t)
    data["path"] = display(t.path)  # valid UTF-8 whatever bytes the name has
    data["segments"] = [segment_data(s) for s in t.segments]
    if not t.dropped_windows:  # named only when there are some: other files' json stays as it was
        del data["dropped_windows"]
    return data


def segment_data(s: Segment) -> dict:
    """A segment as JSON, with ``words`` (whisper's: start, end, word, probability) only when it has some."""
    data = asdict(s)
    if not s.words:
        del data["words"]
    if s.language is None:  # detected languages only (language=None, auto)
        del data["language"], data["language_probability"]
    return data


def transcript_from_data(data: dict) -> Transcript:
    """The Transcript ``result_data`` was made from (its path as printed). KeyError or TypeError for data
    that is not such a record (a record written by an older version, or edited by hand)."""
    known = {f.name for f in fields(Transcript)}
    values = {k: v for k, v in data.items() if k in known}
    values["segments"] = tuple(Segment(**{**s, "words": tuple(Word(**w) for w in s.get("words", ()))})
                               for s in data["segments"])
    values["decode_warnings"] = tuple(data.get("decode_warnings", ()))
    values["dropped_windows"] = tuple(DroppedWindow(**w) for w in data.get("dropped_windows", ()))
    values["accepted_hist"] = {int(k): v for k, v in data.get("accepted_hist", {}).items()}
    return Transcript(**values)


def is_timed(t: Transcript, options: TranscribeOptions) -> bool:
    """Whether ``t``'s segments carry Whisper's timestamps: asked for (timestamps, word timestamps), or a file
    longer than one window (always decoded with them). A file of one window decoded without them has one
    segment spanning the window: no use for srt, vtt or tsv."""
    return options.timestamps or options.word_timestamps or t.duration > WINDOW_SECONDS

