"""What `tandem transcribe` prints as it goes and at the end: the progress bar's figures and the summary's
lines (``pipelines/cli/transcribe.py``)."""

from __future__ import annotations

from types import SimpleNamespace


def test_identical_outputs_says_what_it_compares_when_windows_were_sampled():
    """``--compare`` compares the temperature-0 decodes token for token; a window the safeguards sampled hotter
    keeps the main model's distribution, not its draws, so the summary says so instead of a bare N/N."""
    from pipelines.asr import TranscribeOptions
    from pipelines.asr.batch import BatchRun
    from pipelines.asr.options import Transcript
    from pipelines.cli.transcribe import summary_lines

    def line(retried):
        t = Transcript("a.wav", "x", 1.0, 1.0, decode_seconds=1.0, plain_seconds=2.0, identical=True, retried=retried)
        job = SimpleNamespace(options=TranscribeOptions(), again=(), not_audio=(), tree=None)
        return next(x for x in summary_lines(BatchRun((t,), 0, 1.0, False), job, {}, None) if "vs plain" in x)

    assert line(0).endswith("identical outputs 1/1")
    assert "identical outputs 1/1 at temperature 0 (the 2 windows sampled hotter" in line(2)


def test_the_progress_bar_shows_no_real_time_factor_before_any_audio():
    """A first file that failed (0 s of audio decoded) once showed rtf=4051114153.000 on the bar."""
    import time

    from pipelines.asr.options import Transcript
    from pipelines.cli.transcribe import _progress

    class Bar:
        def __init__(self):
            self.postfix = None

        def write(self, line):
            pass

        def set_postfix(self, **values):
            self.postfix = values

        def update(self, n):
            pass

    bar = Bar()
    show = _progress(bar, time.perf_counter())
    show(Transcript("bad.wav", "", 0.0, 0.0, error="audio track 5 asked for, but the file has 1 audio track"))
    assert bar.postfix == {"audio": "0s"}
    show(Transcript("good.wav", "x", 2.0, 0.1))
    assert set(bar.postfix) == {"audio", "rtf"} and float(bar.postfix["rtf"]) < 60
