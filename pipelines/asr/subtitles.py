"""Subtitles from word timestamps, openai/whisper's writer (``whisper/utils.py`` SubtitlesWriter.iterate_result):
words gathered into lines and cues under ``--max-line-width``, ``--max-line-count`` and
``--max-words-per-line``, each word underlined in turn with ``--highlight-words``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from .options import Segment, Word


@dataclass(frozen=True)
class SubtitleOptions:
    """whisper's subtitle options (its names); they act only on segments with words."""

    highlight_words: bool = False  # each word underlined (<u>) in turn, one cue per word
    max_line_width: int | None = None  # characters in a line before it breaks
    max_line_count: int | None = None  # lines in a cue before a new one (with max_line_width: cues ignore segments)
    max_words_per_line: int | None = None  # words in a line (no effect with max_line_width)

    @property
    def any(self) -> bool:
        return self.highlight_words or any(v is not None for v in (self.max_line_width, self.max_line_count,
                                                                    self.max_words_per_line))


def _subtitles(segments: tuple[Segment, ...], options: SubtitleOptions) -> Iterator[list[Word]]:
    """Word lists, one per cue; a word's text starts with "\\n" where a line breaks (whisper's loop)."""
    preserve_segments = options.max_line_count is None or options.max_line_width is None
    width = options.max_line_width or 1000
    per_line = options.max_words_per_line or 1000
    line_len, line_count, subtitle = 0, 1, []
    last = segments[0].words[0].start if segments and segments[0].words else 0.0
    for segment in segments:
        for chunk in range(0, len(segment.words), per_line):
            for i, timing in enumerate(segment.words[chunk:chunk + per_line]):
                long_pause = not preserve_segments and timing.start - last > 3.0
                has_room = line_len + len(timing.word) <= width
                seg_break = i == 0 and len(subtitle) > 0 and preserve_segments
                if line_len > 0 and has_room and not long_pause and not seg_break:
                    line_len += len(timing.word)  # the line goes on
                else:
                    timing = replace(timing, word=timing.word.strip())  # a new line
                    if (subtitle and options.max_line_count is not None
                            and (long_pause or line_count >= options.max_line_count) or seg_break):
                        yield subtitle  # and a new cue
                        subtitle, line_count = [], 1
                    elif line_len > 0:
                        line_count += 1
                        timing = replace(timing, word="\n" + timing.word)
                    line_len = len(timing.word.strip())
                subtitle.append(timing)
                last = timing.start
    if subtitle:
        yield subtitle


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def cues(segments: tuple[Segment, ...], options: SubtitleOptions = SubtitleOptions()) -> Iterator[tuple[float, float, str]]:
    """(start, end, text) of each subtitle cue: from words when the segments have them (whisper's layout), else
    one cue per segment. With ``highlight_words``, a cue per word with that word underlined, and the gaps
    between words shown plainly."""
    if not any(s.words for s in segments):
        yield from ((s.start, s.end, s.text) for s in segments)
        return
    for subtitle in _subtitles(segments, options):
        text = "".join(w.word for w in subtitle)
        if not options.highlight_words:
            yield subtitle[0].start, subtitle[-1].end, text
            continue
        last = subtitle[0].start
        for i, word in enumerate(subtitle):
            if _ms(last) != _ms(word.start):
                yield last, word.start, text
            yield word.start, word.end, "".join(re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", w.word) if j == i
                                                else w.word for j, w in enumerate(subtitle))
            last = word.end
