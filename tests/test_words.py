"""Word-level timestamps (pipelines/asr/words.py): whisper's pieces on small arrays, then words on the
embedded Whisper base, identical with and without the assistant."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipelines.asr import words as W


def _dtw_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """openai/whisper's dtw_cpu, loop for loop (numba left out)."""
    n, m = x.shape
    cost = np.ones((n + 1, m + 1), dtype=np.float32) * np.inf
    trace = -np.ones((n + 1, m + 1), dtype=np.float32)
    cost[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    return W._backtrace(trace)


def test_dtw_follows_the_cheap_diagonal():
    x = np.ones((3, 6))
    x[0, :2] = x[1, 2:4] = x[2, 4:] = 0
    rows, cols = W.dtw(x)
    assert rows.tolist() == [0, 0, 1, 1, 2, 2] and cols.tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (5, 1), (4, 9), (12, 40)])
def test_dtw_matches_whispers_loop(shape):
    rng = np.random.default_rng(sum(shape))
    for x in (rng.standard_normal(shape), np.round(rng.standard_normal(shape), 1)):  # rounded: ties
        got, want = W.dtw(x), _dtw_reference(x)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


def test_median_filter_is_the_reflect_padded_median():
    x = torch.tensor([[5.0, 1.0, 4.0, 2.0, 8.0, 3.0, 7.0, 0.0, 6.0]])
    padded = np.pad(x.numpy()[0], 3, mode="reflect")
    want = [np.median(padded[i:i + 7]) for i in range(9)]
    assert W.median_filter(x, 7)[0].tolist() == want
    assert W.median_filter(torch.ones(2, 3), 7).tolist() == torch.ones(2, 3).tolist()  # too short: unchanged


def test_merge_punctuations_as_whisper():
    timings = [W._Timing(w, [i], i, i + 1, 1.0) for i, w in enumerate([" \"", "Hello", ",", " world", ".", "\""])]
    W.merge_punctuations(timings, W.PREPEND_PUNCTUATIONS, W.APPEND_PUNCTUATIONS)
    assert [t.word for t in timings] == ["", " \"Hello,", "", " world.\"", "", ""]
    assert [t.tokens for t in timings] == [[], [0, 1, 2], [], [3, 4, 5], [], []]


def test_split_words_on_spaces_and_characters(base_runner):
    tok = base_runner.tokenizer
    eot = base_runner.model.generation_config.eos_token_id

    def decode(ids):
        return tok.convert_tokens_to_string(tok.convert_ids_to_tokens(ids))

    ids = tok.encode(" He was ill-disposed, you know.", add_special_tokens=False) + [eot]
    words, groups = W.split_words(decode, ids, "en", eot)
    assert words == [" He", " was", " ill", "-disposed", ",", " you", " know", ".", "<|endoftext|>"]
    assert sum(groups, []) == ids
    zh = tok.encode("你好世界", add_special_tokens=False)
    words, _ = W.split_words(decode, zh, "zh", eot)
    assert "".join(words) == "你好世界" and all("\ufffd" not in w for w in words)


@pytest.mark.parametrize("name", ["whisper-base", "whisper-tiny.en"])
def test_published_heads_are_the_generation_configs(name):
    from types import SimpleNamespace

    from pipelines.models.loading import load_generation_config
    from pipelines.models.registry import load_registry

    main = load_registry().get(name).main
    gen = load_generation_config(main)
    layers, heads = (6, 8) if "base" in name else (4, 6)
    bare = SimpleNamespace(generation_config=SimpleNamespace(is_multilingual=gen.is_multilingual),
                           config=SimpleNamespace(decoder_layers=layers, decoder_attention_heads=heads))
    assert W.alignment_heads(bare) == [tuple(h) for h in gen.alignment_heads]


def test_the_next_window_starts_at_the_last_word_as_whispers():
    from pipelines.asr.options import Segment, Word

    tb = 50365
    segs = [Segment(30.0, 34.0, "a", words=(Word(30.1, 33.5, " a", 0.9),)),
            Segment(34.0, 40.0, "b", words=(Word(34.2, 38.73, " b", 0.9),))]
    two_stamps = [tb, 1, tb + 200, tb + 200, 2, tb + 500, tb + 520, 3]  # ends in an unfinished segment
    assert W.seek_after_words(segs, two_stamps, tb, 30.0, 10.0) == pytest.approx(8.73)
    assert W.seek_after_words(segs, [tb, 1, tb + 200, tb + 200, 2, tb + 500], tb, 30.0, 29.5) == 29.5  # single
    assert W.seek_after_words([], two_stamps, tb, 30.0, 10.0) == 10.0
    assert W.seek_after_words(segs, two_stamps, tb, 40.0, 10.0) == 10.0  # the last word before the window


def _words(transcripts):
    return [[(s.start, s.end, s.text, s.words) for s in t.segments] for t in transcripts]


@pytest.fixture(scope="module")
def clips(speech_real):
    return [item["audio_path"] for item in speech_real[:4]]


def test_words_match_the_text_in_order(registry, base_runner, clips):
    from pipelines.asr import TranscribeOptions, transcribe

    for t in transcribe(clips[:2], registry.get("whisper-base"), TranscribeOptions(word_timestamps=True),
                        runner=base_runner):
        assert t.segments
        for seg in t.segments:
            assert "".join(w.word for w in seg.words).strip() == seg.text
            times = [x for w in seg.words for x in (w.start, w.end)]
            assert times == sorted(times) and seg.start <= times[0] and times[-1] <= seg.end <= t.duration + 0.02
            assert all(0 < w.probability <= 1 for w in seg.words)


def test_words_with_the_assistant_are_plains(registry, base_runner, clips, tmp_path):
    from pipelines.asr import TranscribeOptions, WhisperRunner, transcribe
    from pipelines.audio import load_audio, write_wav

    long_file = tmp_path / "long.wav"  # four clips and again, over 30 s: two windows, the second from a seek
    write_wav(long_file, np.concatenate([load_audio(p) for p in clips * 2]))
    files = [*clips, long_file]
    options = TranscribeOptions(word_timestamps=True, batch_size=2)
    plain = list(transcribe(files, registry.get("whisper-base"), options, runner=base_runner))
    pair = registry.get("whisper-base+distilled")
    assisted = list(transcribe(files, pair, options, runner=WhisperRunner(pair)))
    assert plain[-1].duration > 30 and sum(len(s.words) for s in plain[-1].segments) > 60
    assert _words(assisted) == _words(plain)


def _segments():
    from pipelines.asr.options import Segment, Word

    words = [Word(0.0, 0.5, " Hello", 0.9), Word(0.5, 1.0, " there,", 0.8), Word(1.2, 1.4, " my", 0.7),
             Word(1.4, 1.8, " old", 0.9), Word(1.8, 2.4, " friend.", 0.95)]
    return (Segment(0.0, 2.4, "Hello there, my old friend.", words=tuple(words)),)


def test_srt_words_per_line_and_highlight_as_whispers_writer():
    from pipelines.asr.outputs import format_srt
    from pipelines.asr.subtitles import SubtitleOptions

    assert format_srt(_segments(), SubtitleOptions(max_words_per_line=3)) == (
        "1\n00:00:00,000 --> 00:00:01,400\nHello there, my\n\n"
        "2\n00:00:01,400 --> 00:00:02,400\nold friend.\n")
    cues = format_srt(_segments(), SubtitleOptions(highlight_words=True, max_words_per_line=3)).split("\n\n")
    assert cues == ["1\n00:00:00,000 --> 00:00:00,500\n<u>Hello</u> there, my",
                    "2\n00:00:00,500 --> 00:00:01,000\nHello <u>there,</u> my",
                    "3\n00:00:01,000 --> 00:00:01,200\nHello there, my",  # the gap before "my", plain
                    "4\n00:00:01,200 --> 00:00:01,400\nHello there, <u>my</u>",
                    "5\n00:00:01,400 --> 00:00:01,800\n<u>old</u> friend.",
                    "6\n00:00:01,800 --> 00:00:02,400\nold <u>friend.</u>\n"]
    lines = format_srt(_segments(), SubtitleOptions(max_line_width=12, max_line_count=2))
    assert lines == "1\n00:00:00,000 --> 00:00:01,800\nHello there,\nmy old\n\n2\n00:00:01,800 --> 00:00:02,400\nfriend.\n"


def test_json_has_words_only_with_word_timestamps():
    import json

    from pipelines.asr.options import Transcript
    from pipelines.asr.outputs import format_json

    seg = json.loads(format_json(Transcript("a.wav", "x", 2.4, 1.0, segments=_segments())))["segments"][0]
    assert seg["words"][0] == {"start": 0.0, "end": 0.5, "word": " Hello", "probability": 0.9}
    bare = json.loads(format_json(Transcript("a.wav", "x", 2.4, 1.0, segments=(_segments()[0].__class__(0, 1, "x"),))))
    assert "words" not in bare["segments"][0]


def test_subtitle_options_need_word_timestamps():
    from pipelines.asr.batch import BatchError
    from pipelines.cli.parser import build_parser
    from pipelines.cli.transcribe import subtitle_options

    parse = build_parser().parse_args
    with pytest.raises(BatchError, match="need --word-timestamps"):
        subtitle_options(parse(["transcribe", "a.wav", "--highlight-words"]))
    assert subtitle_options(parse(["transcribe", "a.wav", "--word-timestamps", "--max-words-per-line", "3"])).any
