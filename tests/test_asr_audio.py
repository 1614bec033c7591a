"""Transcripts of audio as it comes from the world: a video whose sound starts 2 s in (its cues must not be
2 s early), the second audio track of a file, a WAV whose header says 0 bytes, a recording cut in half.
Containers are made here with PyAV from the built speech-real clips."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from test_audio_damage import aac, mux

from pipelines.asr import TranscribeOptions, transcribe
from pipelines.asr.outputs import render
from pipelines.asr.tracks import first_speech_track
from pipelines.audio import load_audio


@pytest.fixture(scope="module")
def clips(speech_real):
    ids = ("librivox-sense_and_sensibility_01_austen_64kb-0880", "goforward")
    by_id = {i["id"]: Path(i["audio_path"]) for i in speech_real}
    return [by_id[i] for i in ids]


def _one(path, registry, runner, **options):
    return list(transcribe([path], registry.get("whisper-base"), TranscribeOptions(**options), runner))[0]


def test_cues_of_a_video_whose_audio_starts_late_keep_the_container_time(tmp_path, clips, registry, base_runner):
    plain = _one(clips[0], registry, base_runner, timestamps=True)
    video = tmp_path / "late.mkv"
    mux(video, "matroska", [(load_audio(clips[0]), 2.0)], video_seconds=6.0)
    late = _one(video, registry, base_runner, timestamps=True)
    assert late.ok and late.text == plain.text and late.start_offset == pytest.approx(2.0)
    assert [(s.start, s.end) for s in late.segments] == [(pytest.approx(s.start + 2.0, abs=0.01),
                                                          pytest.approx(s.end + 2.0, abs=0.01)) for s in plain.segments]
    assert late.segments[0].start >= 2.0
    first = render(late, "srt").splitlines()[1]
    assert first.startswith("00:00:02,") or first.startswith("00:00:03,")
    assert json.loads(render(late, "json"))["start_offset"] == pytest.approx(2.0)


def test_the_second_audio_track_is_transcribed_when_asked(tmp_path, clips, registry, base_runner):
    both = tmp_path / "two.mkv"
    mux(both, "matroska", [(load_audio(clips[0]), 0.0), (load_audio(clips[1]), 0.0)])
    first, second = _one(both, registry, base_runner), _one(both, registry, base_runner, audio_track=1)
    assert "young man" in first.text.lower() and "forward" in second.text.lower()
    assert (first.audio_track, second.audio_track, second.audio_tracks) == (0, 1, 2)
    one = _one(clips[1], registry, base_runner)
    assert one.audio_track is None and one.audio_tracks == 1  # a file of one track does not name it
    wrong = _one(clips[1], registry, base_runner, audio_track=1)
    assert not wrong.ok and "has 1 audio track" in wrong.error


def test_an_aac_m4a_gives_the_wav_segment_times(tmp_path, clips, registry, base_runner):
    speech = np.concatenate([np.zeros(8000, np.float32), load_audio(clips[0]), np.zeros(16000, np.float32),
                             load_audio(clips[1])])
    wav, m4a = tmp_path / "talk.wav", tmp_path / "talk.m4a"
    sf.write(wav, speech, 16000, subtype="PCM_16")
    aac(m4a, "mp4", speech, options={"use_editlist": "0"})  # priming not marked: 21 ms late unless dropped
    plain, packed = (_one(p, registry, base_runner, timestamps=True) for p in (wav, m4a))
    assert packed.ok and "forward" in packed.text.lower() and len(packed.segments) == len(plain.segments) > 1
    for a, b in zip(plain.segments, packed.segments):  # AAC may change a word ("ill-sposed"), not the times
        assert (b.start, b.end) == (pytest.approx(a.start, abs=0.01), pytest.approx(a.end, abs=0.01))


def _tone(seconds: float) -> np.ndarray:
    """A steady 440 Hz tone at a third of full scale: loud, but not speech."""
    return (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(seconds * 16000)) / 16000)).astype(np.float32)


def test_with_no_track_asked_the_first_track_with_speech_is_read(tmp_path, clips, registry, base_runner):
    speech = load_audio(clips[1])
    quiet = tmp_path / "silence_then_speech.mkv"
    mux(quiet, "matroska", [(np.zeros_like(speech), 0.0), (speech, 0.0)])
    assert first_speech_track(quiet) == (1, True)
    result = _one(quiet, registry, base_runner)
    assert result.ok and "forward" in result.text.lower()
    assert (result.audio_track, result.audio_tracks, result.audio_track_chosen) == (1, 2, True)
    assert result.audio_note == "audio track 1 of 2 (counted from 0; the first with speech)"
    assert json.loads(render(result, "json"))["audio_track"] == 1
    asked = _one(quiet, registry, base_runner, audio_track=0)  # asked for: read as asked, silence
    assert (asked.text, asked.audio_track, asked.audio_track_chosen) == ("", 0, False)
    both = tmp_path / "two.mkv"
    mux(both, "matroska", [(load_audio(clips[0]), 0.0), (speech, 0.0)])
    assert first_speech_track(both) == (0, True)
    assert first_speech_track(clips[1]) == (0, False)  # one track: nothing to choose, nothing sampled
    mute = tmp_path / "mute.mkv"
    mux(mute, "matroska", [(np.zeros(16000, np.float32), 0.0), (np.zeros(16000, np.float32), 0.0)])
    assert first_speech_track(mute) == (0, False)  # no track with speech: the first, as before


def test_a_tone_track_before_the_speech_is_passed_over(tmp_path, clips):
    pytest.importorskip("faster_whisper", reason="the tone is told from speech by Silero VAD (the vad extra); "
                        "the energy detector alone hears sound")
    speech = load_audio(clips[1])
    long = np.concatenate([np.zeros(16000 * 22, np.float32), speech, np.zeros(16000 * 30, np.float32)])
    # AAC, 55 s: sampled 8 s from 0, 18.3 and 36.5 s, so the speech at 22 s is found in the middle stretch
    toned = tmp_path / "tone_then_speech.mp4"
    mux(toned, "mp4", [(_tone(len(long) / 16000), 0.0), (long, 0.0)], codec="aac")
    assert first_speech_track(toned) == (1, True)


def test_a_wav_whose_header_says_zero_bytes_is_transcribed_and_marked(tmp_path, clips, registry, base_runner):
    crashed = tmp_path / "crashed.wav"
    sf.write(crashed, load_audio(clips[1]), 16000, subtype="PCM_16")
    data = bytearray(crashed.read_bytes())
    at = data.find(b"data")
    data[at + 4 : at + 8] = struct.pack("<I", 0)
    crashed.write_bytes(bytes(data))
    result = _one(crashed, registry, base_runner)
    assert result.ok and "forward" in result.text.lower()
    assert result.damaged and not result.truncated and result.seconds_recovered == pytest.approx(result.duration, abs=0.01)
    assert "header declares no audio" in result.decode_warnings[0]


def test_a_recording_cut_in_half_is_marked_truncated(tmp_path, clips, registry, base_runner):
    cut = tmp_path / "cut.flac"
    sf.write(cut, load_audio(clips[0]), 16000)
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    result = _one(cut, registry, base_runner)
    assert result.ok and result.truncated and result.damaged
    assert 1.0 < result.seconds_recovered < 2.0
    record = json.loads(render(result, "json"))
    assert record["truncated"] is True and record["seconds_recovered"] == result.seconds_recovered


def test_the_audio_note_names_what_was_wrong():
    from pipelines.asr import Transcript

    assert Transcript("a.wav", "hi", 1.0, 0.1).audio_note == ""
    cut = Transcript("a.flac", "hi", 4.9, 0.1, truncated=True, damaged=True, seconds_recovered=4.86,
                     decode_warnings=("truncated: the file ends at 4.86 s of the 10.00 s it declares",))
    assert cut.audio_note == "truncated, 4.9 s recovered"
    hole = Transcript("a.mp3", "hi", 8.5, 0.1, damaged=True, seconds_recovered=8.5, audio_track=1, audio_tracks=2,
                      start_offset=4.978, decode_warnings=("a damaged block at 4.79 s was skipped", "1.47 s lost"))
    assert hole.audio_note == ("damaged (a damaged block at 4.79 s was skipped and 1 more), 8.5 s recovered; "
                               "audio track 1 of 2 (counted from 0); audio starts at 4.98 s")


def test_the_command_names_damaged_files_and_the_track_it_read(tmp_path, clips, capsys):
    from pipelines.cli import main

    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    mux(inbox / "two.mkv", "matroska", [(load_audio(clips[0]), 0.0), (load_audio(clips[1]), 0.0)])
    sf.write(inbox / "cut.flac", load_audio(clips[0]), 16000)
    data = (inbox / "cut.flac").read_bytes()
    (inbox / "cut.flac").write_bytes(data[: len(data) // 2])
    code = main(["transcribe", str(inbox), "--model", "whisper-base", "--out", str(out), "-f", "json"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "cut.flac (truncated, 1." in printed and "two.mkv (2 audio tracks: 0 read)" in printed
    assert json.loads((out / "cut.json").read_text())["truncated"] is True
    assert json.loads((out / "two.json").read_text())["audio_track"] == 0

    code = main(["transcribe", str(inbox / "two.mkv"), "--model", "whisper-base", "--audio-track", "1",
                 "--out", str(out), "-f", "json"])
    assert code == 2 and "--force" in capsys.readouterr().err  # track 0's transcript is not overwritten in silence
    code = main(["transcribe", str(inbox / "two.mkv"), "--model", "whisper-base", "--audio-track", "1",
                 "--out", str(out), "-f", "json", "--force"])
    printed = capsys.readouterr().out
    record = json.loads((out / "two.json").read_text())
    assert code == 0 and record["audio_track"] == 1 and "forward" in record["text"].lower()
    assert "audio track 1 of 2 (counted from 0)" in printed
