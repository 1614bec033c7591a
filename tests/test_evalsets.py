"""Evaluation sets: built offline from registry packages and the project's own texts, idempotently."""

import shutil

import pytest

from pipelines.audio import load_audio
from pipelines.quality import sets as evalsets
from pipelines.quality.sets import build_set, read_manifest, store, text


def test_speech_real_has_the_12_utterances(speech_real):
    assert len(speech_real) == 12
    ids = {item["id"] for item in speech_real}
    assert {"goforward", "forever", "cards-001", "cards-005"} <= ids
    assert sum(i["id"].startswith("librivox-") for i in speech_real) == 5
    for item in speech_real:
        assert item["reference"] and item["provenance"]["package"].startswith("pocketsphinx")
        assert 1.0 < len(load_audio(item["audio_path"])) / 16000 < 8.0


def test_second_build_does_nothing(speech_real):
    info = build_set("speech-real")
    assert info.built is False and info.count == 12


def test_damaged_set_is_rebuilt(speech_real):
    folder = evalsets.set_dir("speech-real")
    manifest = folder / evalsets.MANIFEST
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join(lines[:5]) + "\n")  # a half-written manifest
    info = build_set("speech-real")
    assert info.built is True and info.count == 12 and len(read_manifest("speech-real")) == 12


def test_project_texts_meet_the_brief():
    sentences = evalsets.project_sentences()
    assert len(sentences) >= 300 and len(set(sentences)) == len(sentences)
    assert any("?" in s for s in sentences) and any(len(s.split()) > 20 for s in sentences)
    docs = evalsets.project_documents()
    assert len(docs) >= 30
    assert all(150 <= len(d["document"].split()) <= 600 and d["summary"] for d in docs)


def test_summarize_own():
    info = build_set("summarize-own")
    items = read_manifest("summarize-own")
    assert info.count == len(items) == 30
    assert all(i["input"] and i["reference"] for i in items)


def test_translate_udhr_pairs():
    info = build_set("translate-udhr")
    items = read_manifest("translate-udhr")
    assert info.count == len(items)
    langs = {i["target_lang"] for i in items}
    assert len(langs) >= 5 and {"deu", "fra", "spa", "rus"} <= langs
    first = next(i for i in items if i["id"] == "udhr-eng-fra-1.1")
    assert first["input"].startswith("All human beings are born free")
    assert first["reference"].startswith("Tous les êtres humains naissent libres")


def test_udhr_alignment_falls_back_to_whole_sections():
    pairs = text.align_sections({"1": ["a", "b"], "2": ["c", "d"], "3": ["e"]}, {"1": ["A", "B"], "2": ["CD"]})
    assert pairs == [("1.1", "a", "A"), ("1.2", "b", "B"), ("2", "c d", "CD")]


needs_tts = pytest.mark.skipif(shutil.which("flite") is None, reason="flite (Debian) is not installed")


@needs_tts
def test_speech_synth_voices_and_texts():
    info = build_set("speech-synth")
    items = read_manifest("speech-synth")
    assert info.count == len(items) >= 300
    voices = {i["voice"] for i in items}
    assert "piper:joe" in voices and sum(v.startswith("flite:") for v in voices) >= 2
    assert {i["reference"] for i in items} == set(evalsets.project_sentences())


@needs_tts
def test_speech_long_segments_are_true_times():
    build_set("speech-long")
    items = read_manifest("speech-long")
    assert len(items) >= 5
    for item in items:
        assert 60 <= item["duration"] <= 300
        segs = item["segments"]
        assert all(a["end"] < b["start"] for a, b in zip(segs, segs[1:]))
        audio = load_audio(item["audio_path"])
        # Pauses between sentences are silent; speech is where the segments say it is.
        gap = audio[int(segs[0]["end"] * 16000) + 400 : int(segs[1]["start"] * 16000) - 400]
        first = audio[int(segs[0]["start"] * 16000) : int(segs[0]["end"] * 16000)]
        assert abs(gap).max() < 1e-3 < abs(first).max()


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs a Debian machine with apt-get")
def test_summarize_debian():
    info = build_set("summarize-debian")
    items = read_manifest("summarize-debian")
    assert info.count == len(items) > 500
    assert all(i["words"] >= evalsets.DEBIAN_MIN_WORDS and i["reference"] for i in items)


def test_unknown_set():
    with pytest.raises(evalsets.DataBuildError, match="unknown set"):
        build_set("speech-imaginary")


def test_concurrent_builds_of_one_set_build_it_once(tmp_path, monkeypatch):
    """Two builders of the same set at once (Ray actors, parallel test workers): the second waits for the
    first's lock and finds the set built."""
    import threading
    import time

    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    calls = []

    def build(folder):
        calls.append(1)
        time.sleep(0.3)
        return [{"id": "a", "input": "x"}]

    results = []
    threads = [threading.Thread(target=lambda: results.append(store.build_atomically("lock-test", {"v": 1}, build, False)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert sorted(r.built for r in results) == [False, True] and {r.count for r in results} == {1}
