"""Continuous batching of transcriptions (``asr.continuous``): files joining a run at the engine's round
boundaries get the transcripts ``transcribe`` gives each file alone, with the safeguards' fallbacks and word
timestamps; a file dropped by ``watch`` leaves the others as they were."""

from dataclasses import replace
from pathlib import Path

import pytest

from pipelines.asr import TranscribeOptions, transcribe
from pipelines.asr.continuous import supports, transcribe_continuously


@pytest.fixture(scope="module")
def asr(distilled_asr):
    return distilled_asr


@pytest.fixture(scope="module")
def files(speech_real):
    """Three short clips of speech-real and speech-long's shortest file (72 s: three windows, with timestamps)."""
    from pipelines.quality.sets import build_set, read_manifest

    build_set("speech-long")
    long = min(read_manifest("speech-long"), key=lambda i: i["duration"])
    short = sorted(speech_real, key=lambda i: i["duration"])[:3]
    return [Path(long["audio_path"])] + [Path(i["audio_path"]) for i in short]


def _alone(asr, files, options):
    runner, pair = asr
    return {str(f): next(transcribe([f], pair, replace(options, batch_size=1), runner=runner)) for f in files}


def _continuous(asr, files, options, watch=None):
    """The files through ``transcribe_continuously``, the first at the start and one more every round."""
    runner, pair = asr
    waiting = list(files[1:])

    def admit(room: int):
        return [waiting.pop(0)] if waiting and room else []

    return {t.path: t for t in transcribe_continuously(files[:1], pair, options, runner=runner, admit=admit,
                                                       watch=watch)}


def _same(a, b):
    assert a.text == b.text and a.tokens == b.tokens and a.error == b.error
    assert [(s.start, s.end, s.text) for s in a.segments] == [(s.start, s.end, s.text) for s in b.segments]
    assert a.dropped_windows == b.dropped_windows and a.retried == b.retried and a.skipped == b.skipped


@pytest.mark.parametrize("options", [
    TranscribeOptions(language="en", batch_size=3),
    # every window falls back (its avg log-probability is below 0) and is sampled, then dropped at 0.2
    TranscribeOptions(language="en", batch_size=3, logprob_threshold=0.0, temperature=(0.0, 0.2)),
], ids=["greedy", "fallbacks"])
def test_files_joining_mid_run_equal_each_file_alone(asr, files, options):
    alone = _alone(asr, files, options)
    got = _continuous(asr, files, options)
    assert sorted(got) == sorted(alone)
    for path, transcript in alone.items():
        _same(got[path], transcript)
    if options.logprob_threshold == 0.0:
        assert all(t.retried for t in got.values())


def test_word_timestamps_and_auto_language_equal_each_file_alone(asr, files):
    options = TranscribeOptions(word_timestamps=True, batch_size=2)
    alone = _alone(asr, files[:3], options)
    got = _continuous(asr, files[:3], options)
    for path, transcript in alone.items():
        _same(got[path], transcript)
        words = [(w.word, w.start, w.end) for s in got[path].segments for w in s.words]
        assert words == [(w.word, w.start, w.end) for s in transcript.segments for w in s.words] and words
        assert got[path].language == transcript.language == "en"


def test_a_file_dropped_by_watch_leaves_its_row_and_the_others_as_they_were(asr, files):
    options = TranscribeOptions(language="en", batch_size=4)
    alone = _alone(asr, files[1:], options)
    seen = []

    def watch(path: str, segments) -> bool:
        seen.append(path)
        return path != str(files[0]) or len([p for p in seen if p == path]) < 3  # gone at its third round

    got = _continuous(asr, files, options, watch=watch)
    assert str(files[0]) not in got
    for path, transcript in alone.items():
        _same(got[path], transcript)


def test_options_it_cannot_batch_continuously_are_refused(asr, files):
    runner, pair = asr
    for options in (TranscribeOptions(beam_size=2), TranscribeOptions(temperature=(0.5,)),
                    TranscribeOptions(long_form="chunked"), TranscribeOptions(compare=True)):
        assert not supports(options)
        with pytest.raises(ValueError, match="continuous"):
            next(transcribe_continuously(files[:1], pair, options, runner=runner))
    assert supports(TranscribeOptions())
