"""The labelled corpus kept in the repository: recipes give the same audio again, shards are checksummed and
written atomically, another teacher's labels are refused, a changed synthesiser is noticed, and a second run
on a fresh folder takes its labels from the corpus instead of decoding again (a sentence gone from the index
is skipped and counted)."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import time

import pytest

from pipelines.distill import DistillError, DistillOptions, corpus_labelled, distill, read_shard
from pipelines.distill.corpus import Corpus, CorpusError, LabelledClip
from pipelines.distill.heldout import FORTUNES as HELD_OUT_FORTUNES
from pipelines.distill.speech import Recipe, Sentences, audio_sha256, is_heldout, make_recipe, render
from pipelines.quality.sets import project_sentences
from pipelines.synthesis import Speaker

TEACHER = "embedded:whisper-base bfloat16"


@pytest.fixture(autouse=True)
def no_fortunes(monkeypatch):
    """No fortunes package downloaded (``debian.read_fortunes`` of the cache gives none): these tests give
    their own sentences."""
    from pipelines import debian

    real = debian.read_fortunes
    monkeypatch.setattr(debian, "read_fortunes", lambda package="fortunes", folder=None: real(package, folder) if folder else [])


@pytest.fixture(scope="module")
def sentences() -> Sentences:
    """Debian-like addresses over the project's own sentences (no apt index needed)."""
    text = {("pkg%d" % i, "%032x" % i, 0): s for i, s in enumerate(project_sentences()[:24])}
    refs = sorted(text)
    return Sentences(text, refs[4:], refs[:4])


def test_a_recipe_renders_the_same_audio_again(sentences, tmp_path):
    speaker, rng = Speaker(), random.Random(3)
    recipes = [make_recipe(rng, sentences.train, sentences.text, speaker, tmp_path / "a.wav") for _ in range(6)]
    assert {r.kind for r in recipes} == {"clip", "window"}
    for r in recipes:
        again = Recipe.from_json(json.loads(json.dumps(r.to_json())))
        assert again == r
        first, second = render(r, sentences.text, speaker, tmp_path / "b.wav"), render(again, sentences.text, speaker, tmp_path / "c.wav")
        assert audio_sha256(first) == audio_sha256(second) and len(first) > 16000
        assert len(first) <= r.cut * 16000


def test_heldout_split_is_by_text_and_stable():
    texts = [f"Sentence number {i} of the split test." for i in range(2000)]
    held = [t for t in texts if is_heldout(t)]
    assert 10 <= len(held) <= 60 and held == [t for t in texts if is_heldout(t)]


def test_shards_are_checksummed_and_belong_to_one_teacher(sentences, tmp_path):
    recipe = Recipe("clip", (sentences.train[0],), "flite:kal", (("duration_stretch", 1.0),), 0.5, None, 1)
    corpus = Corpus(tmp_path, TEACHER, {"flite": "x"})
    corpus.add(1, [LabelledClip(recipe, (50257,))], ["ab" * 32], {"date": "2026-12-01"})
    assert not list(tmp_path.glob(".*tmp*"))  # written through temporary names, renamed
    again = Corpus(tmp_path, TEACHER, {"flite": "x"})
    assert again.shards() == [1] and again.read(1) == [LabelledClip(recipe, (50257,))]
    with pytest.raises(CorpusError, match="labelled by"):
        Corpus(tmp_path, "embedded:whisper-base float32", {})
    assert again.same_audio(1, 0, "ab" * 32) and not again.same_audio(1, 0, "cd" * 32) and again.same_audio(1, 5, "x")
    path = tmp_path / "shard-00001.json.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()).replace(b"50257", b"50258")))
    with pytest.raises(CorpusError, match="sha256"):
        again.read(1)


def test_two_runs_on_one_corpus_keep_each_others_shards(sentences, tmp_path):
    recipe = Recipe("clip", (sentences.train[0],), "flite:kal", (("duration_stretch", 1.0),), 0.5, None, 1)
    first, second = Corpus(tmp_path, TEACHER, {}), Corpus(tmp_path, TEACHER, {})  # both read the empty manifest
    first.add(1, [LabelledClip(recipe, (1,))], [], {})
    second.add(2, [LabelledClip(recipe, (2,))], [], {})
    assert Corpus(tmp_path, TEACHER, {}).shards() == [1, 2]


def test_labels_are_committed_then_reused_on_a_fresh_folder(sentences, tmp_path, monkeypatch):
    from pipelines.distill import speech

    monkeypatch.setattr(speech, "debian_sentences", lambda exclude, lists_dir=None: sentences)
    corpus = tmp_path / "corpus"
    opts = DistillOptions(main="whisper-base", out=tmp_path / "run1", clips=4, shard_size=4, heldout=2,
                          corpus=corpus, label_only=True)
    assert distill(opts, log=lambda *_: None) is None
    manifest = json.loads((corpus / "manifest.json").read_text())
    assert manifest["teacher"] == TEACHER and sorted(manifest["shards"]) == ["0", "1"]
    assert manifest["shards"]["1"]["items"] == 4 and len(manifest["shards"]["1"]["audio_sha256"]) == 2
    assert manifest["shards"]["1"]["made"]["drafter"] == "whisper-base+distilled"  # labelled with its assistant
    assert not (opts.out / "shards").exists()  # growing the corpus writes no training features
    first = Corpus(corpus, TEACHER, {}).read(1)
    lines = []  # a second growth run with the corpus complete labels nothing
    assert distill(DistillOptions(**{**opts.__dict__, "resume": True}), log=lines.append) is None
    assert not any("labelling" in ln for ln in lines) and corpus_labelled(opts)
    assert not any("assistant drafting" in ln for ln in lines)  # nothing to label: no assistant loaded
    assert not corpus_labelled(DistillOptions(**{**opts.__dict__, "clips": 8}))

    # a fresh working folder: the labels come from the corpus; one sentence has left the index
    used = Corpus(corpus, TEACHER, {}).read(1)[0].recipe.sentences[0]
    gone = Sentences({k: v for k, v in sentences.text.items() if k != used}, sentences.train, sentences.heldout)
    monkeypatch.setattr(speech, "debian_sentences", lambda exclude, lists_dir=None: gone)
    # and clip 1 of shard 1 as if another synthesiser had made its audio: reported, labels kept
    manifest["shards"]["1"]["audio_sha256"][1] = "00" * 32
    (corpus / "manifest.json").write_text(json.dumps(manifest))
    lines = []
    second = DistillOptions(**{**opts.__dict__, "out": tmp_path / "run2", "label_only": False, "steps": 1,
                               "batch_size": 2, "eval_every": 1})
    distill(second, log=lines.append)
    assert any("labels from the corpus" in ln for ln in lines) and any("1 clips skipped" in ln for ln in lines)
    assert not any("assistant drafting" in ln for ln in lines)
    assert any("1 of the checked clips sound different" in ln and "1/1" in ln for ln in lines)
    kept = read_shard(second.out, 1)
    assert len(kept.items) == 3
    assert [tuple(it["labels"]) for it in kept.items] == [c.labels for c in first if used not in c.recipe.sentences]

    # a damaged corpus stops the run with the reason
    shutil.rmtree(second.out / "shards")
    (corpus / "shard-00001.json.gz").write_bytes(b"junk")
    with pytest.raises(DistillError, match="sha256"):
        distill(DistillOptions(**{**second.__dict__, "resume": True}), log=lambda *_: None)


def test_the_index_names_each_description_by_its_md5():
    from pipelines.debian import Description, _parse_translation_index
    from pipelines.distill.speech import split_sentences

    text = ("Package: alpha\nDescription-md5: 0123abcd\nDescription-en: a tool\n First sentence of alpha here.\n .\n"
            " Second one follows it now!\n\nPackage: beta\nDescription-md5: 89ef\nDescription-en: only a synopsis\n")
    got = list(_parse_translation_index(text))
    assert got == [Description("alpha", "0123abcd", "a tool", "First sentence of alpha here. Second one follows it now!")]
    assert split_sentences(got[0].long)[1] == "Second one follows it now!"


def test_an_address_still_resolves_when_another_package_gains_its_sentence(monkeypatch):
    from pipelines import debian
    from pipelines.distill.speech import debian_sentences

    line = "The quick tool converts many kinds of files quickly."
    old = [debian.Description("zeta", "aa", "z", f"Zeta does things well. {line}")]
    monkeypatch.setattr(debian, "read_index", lambda lists_dir=None: old)
    before = debian_sentences(set())
    ref = next(r for r, t in before.text.items() if t == line)
    monkeypatch.setattr(debian, "read_index", lambda lists_dir=None: old + [debian.Description("alpha", "bb", "a", line)])
    after = debian_sentences(set())
    assert after.text[ref] == line  # the recipe's address still gives its sentence
    assert ("alpha", "bb", 0) in after.train + after.heldout and ref not in after.train + after.heldout


def test_the_learning_curve_trains_each_size_and_shows_it_on_the_card(sentences, tmp_path, monkeypatch, speech_real):
    from pipelines.distill import speech

    monkeypatch.setattr(speech, "debian_sentences", lambda exclude, lists_dir=None: sentences)
    opts = DistillOptions(main="whisper-base", out=tmp_path / "run", shard_size=4, heldout=2, corpus=tmp_path / "corpus",
                          curve=(4, 8), steps=2, batch_size=2, eval_every=1)
    folder = distill(opts, log=lambda *_: None)
    card = json.loads((folder / "card.json").read_text())
    sizes = card["sizes"]
    assert [p["clips"] for p in sizes] == [4, 8] and all(p["steps"] == 2 and p["clips_seen"] == 4 for p in sizes)
    assert all(0.0 <= p[k]["agreement"] <= 1.0 and p[k]["tokens_per_call"] >= 1.0 for p in sizes for k in ("heldout", "real"))
    assert sizes[0]["label_seconds"] < sizes[1]["label_seconds"] and sizes[1]["label_devices"][0].startswith("cpu: ")
    assert all(p["layers"] == [0, 5] and p["start"]["tokens_per_call"] >= 1.0 and 0 < p["draft_cost"] < 1 for p in sizes)
    text = (folder / "CARD.md").read_text()
    assert "## Learning curve by corpus size" in text and "(the shipped whisper-base-distilled, its card)" in text
    assert card["shipped"]["draft_vocab"] > 1000 and card["shipped"]["real"]["agreement"] > 0.5  # measured alike
    assert [p.get("role") for p in sizes] == [None, "this assistant"] and "8 (this assistant)" in text
    record = json.loads((tmp_path / "corpus" / "curve.json").read_text())
    assert record["heldout"] == 2 and [p["clips"] for p in record["sizes"]] == [4, 8]
    # a second start goes on from what the folder holds: each size's point is kept, nothing trains again
    lines = []
    distill(DistillOptions(**{**opts.__dict__, "resume": True}), log=lines.append)
    assert not any(ln.startswith("curve ") for ln in lines) and any("assistant written" in ln for ln in lines)
    assert json.loads((tmp_path / "corpus" / "curve.json").read_text()) == record  # the same points, not twice


def test_the_corpus_record_keeps_every_runs_points_and_a_remeasured_one_once(tmp_path):
    from pipelines.distill.curve import curve_table, point_key, record_points

    held = {"agreement": 0.8, "tokens_per_call": 3.5}
    point = {"clips": 64, "layers": [0, 5], "draft_vocab": 900, "draft_cost": 0.2, "steps": 8, "clips_seen": 128,
             "heldout": held, "real": held, "label_seconds": 10.0, "label_devices": ["cpu: x"], "train_seconds": 5.0,
             "device": "cpu: x", "measured": "2026-12-01"}
    assert record_points(tmp_path, [point], 96, print) == [point]
    wider = {**point, "layers": [0, 2, 5], "measured": "2026-12-02"}  # another design at the same size
    again = {**point, "heldout": {**held, "agreement": 0.81}, "measured": "2026-12-03"}  # re-measured: replaces
    bigger = {**point, "clips": 128}
    sizes = record_points(tmp_path, [bigger, wider, again], 96, print)
    assert sizes == [wider, again, bigger]
    assert json.loads((tmp_path / "curve.json").read_text()) == {"heldout": 96, "sizes": sizes}
    said = []
    assert record_points(tmp_path, [point], 48, said.append) == [point]  # another shard 0
    assert "this run on 48" in said[0]
    assert json.loads((tmp_path / "curve.json").read_text())["sizes"] == sizes
    for damaged in ("{not json", '{"sizes": []}', '{"heldout": 96, "sizes": [{"clips": 1}]}', "[]"):
        (tmp_path / "curve.json").write_text(damaged)
        said = []
        assert record_points(tmp_path, [point], 96, said.append) == [point] and "not a learning-curve record" in said[0]
        assert (tmp_path / "curve.json").read_text() == damaged
    medusa = {**point, "layers": [], "drafter": "medusa", "heldout": {**held, "per_head": [0.3] * 3}}
    assert point_key(medusa) != point_key({**medusa, "heldout": {**held, "per_head": [0.3] * 5}})  # heads differ
    rows = curve_table([{**point, "source": "typed in", "role": "this assistant"}])
    assert rows[-1].startswith("| 64 (this assistant; typed in) |") and "(cpu: x, measured 2026-12-01) |" in rows[-1]
    unlabelled = curve_table([{**point, "label_seconds": None, "train_seconds": None}])[-1]
    assert "| not in this corpus | not kept (cpu: x, measured 2026-12-01) |" in unlabelled


def test_the_card_names_this_assistant_and_the_shipped_one_once(tmp_path):
    from pipelines.distill.curve import name_rows

    held = {"agreement": 0.8, "tokens_per_call": 3.5}
    a, b = ({"clips": n, "steps": 8, "layers": [0, 5], "draft_vocab": 900, "heldout": held} for n in (64, 128))
    shipped = {**a, "layers": (0, 5), "name": "old"}  # shipped_point's dict: a recorded point, measured again
    rows, left = name_rows([a, b], b, shipped)
    assert [r.get("role") for r in rows] == ["shipped", "this assistant"] and left is None
    rows, left = name_rows([a, b], b, {**shipped, "clips": 32})  # not recorded: its own row stays
    assert [r.get("role") for r in rows] == [None, "this assistant"] and left["clips"] == 32
    assert name_rows([a, b], a, shipped)[0][0]["role"] == "this assistant, shipped"
    started = "start of this assistant, shipped"  # a --start run's start, where it is the shipped one
    assert name_rows([a, b], b, shipped, started)[0][0]["role"] == started
    assert name_rows([a, b], b, {**shipped, "clips": 32}, started)[1]["role"] == started


def test_a_curve_table_says_when_its_rows_were_trained_for_other_steps():
    from pipelines.distill.curve import curve_table

    held = {"agreement": 0.8, "tokens_per_call": 3.5}
    point = {"clips": 64, "layers": [0, 5], "draft_vocab": 900, "draft_cost": 0.2, "steps": 8, "clips_seen": 128,
             "heldout": held, "real": held, "label_seconds": 10.0, "label_devices": ["cpu: x"], "train_seconds": 5.0,
             "device": "cpu: x"}
    assert curve_table([point, {**point, "clips": 128}])[0].startswith("Each student: the same optimizer steps")
    mixed = curve_table([point, {**point, "clips": 128, "steps": 16}], {**point, "name": "old", "role": "earlier"})
    assert "the optimizer steps of its row" in mixed[0] and "| 128 |" in mixed[5] and "| 16 (128) |" in mixed[5]
    assert "(the earlier old, its card)" in mixed[-1]


def test_draft_cost_counts_a_drafted_tokens_multiply_adds_against_a_main_step():
    from transformers import WhisperConfig

    from pipelines.distill.student import draft_cost, init_layers

    base = WhisperConfig(d_model=512, decoder_ffn_dim=2048, decoder_layers=6, vocab_size=51865)
    # per layer 6 d^2 + 2 d f + 2 T d = 5,206,016; main: 6 layers + 51,865 x 512 = 57,790,976
    assert draft_cost(base, 2, 10671) == round((2 * 5_206_016 + 10671 * 512) / 57_790_976, 3) == 0.275
    assert draft_cost(base, 6, 51865) == 1.0
    assert init_layers(6, 2) == [0, 5] and init_layers(6, 2, "first") == [0, 1] and init_layers(6, 3) == [0, 2, 5]


def test_labels_decoded_with_the_assistant_drafting_are_plain_greedy_labels(sentences, tmp_path):
    """The labelling teacher drafts with the registry's pair over its main model (fewer main passes); every
    label equals the plain teacher's, for a group of 16 items as labelling makes them (short clips and 30 s
    timestamped windows, each kind decoded as one batch)."""
    from pipelines.distill import drafting_pair, resolve_main
    from pipelines.distill.shards import GROUP, _item
    from pipelines.distill.teacher import Teacher

    ref = resolve_main("whisper-base")
    pair = drafting_pair(ref)
    assert pair is not None and pair.name == "whisper-base+distilled"
    speaker, rng = Speaker(piper_threads=1), random.Random(3)  # 3: clips and windows
    recipes = [make_recipe(rng, sentences.train, sentences.text, speaker, tmp_path / "a.wav") for _ in range(GROUP)]
    items = [_item(r, sentences.text, render(r, sentences.text, speaker, tmp_path / "b.wav")) for r in recipes]
    assert {it["kind"] for it in items} == {"clip", "window"}
    drafting, plain = Teacher(ref, "bfloat16", drafting=pair), Teacher(ref, "bfloat16")
    accepted = []
    generate = drafting.engine.generate

    def counted(*args, **kwargs):
        result = generate(*args, **kwargs)
        accepted.append(result.stats.accepted)
        return result

    drafting.engine.generate = counted
    labels = drafting.labels(items, 440)
    assert labels == plain.labels(items, 440) and all(labels)
    assert sum(accepted) > 0  # it did draft
    assert drafting_pair(resolve_main("whisper-tiny.en")) is None  # no pair drafts for it: plain labels
    with pytest.raises(ValueError, match="drafts for"):
        Teacher(resolve_main("whisper-tiny.en"), "float32", drafting=pair)


def test_a_broken_registry_or_assistant_labels_without_an_assistant(monkeypatch):
    import pipelines.distill as distill_pkg
    from pipelines.distill import drafting_pair, labelling_teacher, resolve_main
    from pipelines.models import registry
    from pipelines.models.loading import ModelUnavailableError

    ref = resolve_main("whisper-base")
    made = []

    class FakeTeacher:  # refuses to load an assistant, as a damaged one is refused
        def __init__(self, ref, dtype, device="cpu", drafting=None):
            if drafting is not None:
                raise ModelUnavailableError("whisper-base-distilled: sha256 differs")
            made.append((ref, dtype, device))

    monkeypatch.setattr(distill_pkg, "Teacher", FakeTeacher)
    lines: list[str] = []
    assert isinstance(labelling_teacher(ref, "bfloat16", "cpu", lines.append), FakeTeacher)
    assert made == [(ref, "bfloat16", "cpu")] and "without pair 'whisper-base+distilled'" in lines[0]

    def broken():
        raise registry.RegistryError("models.yaml: pairs.x.main: missing")

    monkeypatch.setattr(registry, "load_registry", broken)
    lines.clear()
    assert drafting_pair(ref, lines.append) is None and "without an assistant" in lines[0]


def test_only_a_whisper_assistant_over_the_main_encoder_drafts_labels(monkeypatch):
    """A pair whose assistant runs its own encoder is not used (the teacher gives it no audio features), nor a
    text main model's pair (equal to plain decoding in float32 tests, not by construction)."""
    from dataclasses import replace

    from pipelines.distill import drafting_pair, resolve_main
    from pipelines.models import registry
    from pipelines.models.loading import ModelRef

    real = registry.load_registry()
    pair = real.pairs["whisper-base+distilled"]
    own_encoder = replace(real, pairs={pair.name: replace(pair, share_encoder=False)})
    monkeypatch.setattr(registry, "load_registry", lambda: own_encoder)
    assert drafting_pair(resolve_main("whisper-base")) is None
    monkeypatch.setattr(registry, "load_registry", lambda: real)
    assert drafting_pair(resolve_main("whisper-base")) == pair
    monkeypatch.setattr("pipelines.distill.is_whisper_ref", lambda ref: False)
    assert drafting_pair(ModelRef("embedded", "whisper-base")) is None


def test_piper_on_one_sleeping_thread_speaks_the_same_samples(sentences, tmp_path):
    from pipelines.synthesis import PIPER_DETERMINISTIC

    texts = [sentences.text[r] for r in sentences.train[:3]]
    settings = [PIPER_DETERMINISTIC, {"length_scale": 1.15, "noise_scale": 0.0, "noise_w_scale": 0.0}]
    default, quiet = Speaker(), Speaker(piper_threads=1)
    for text, config in zip(texts, settings * 2):
        a = default.render("piper:joe", text, tmp_path / "a.wav", piper_config=config)
        b = quiet.render("piper:joe", text, tmp_path / "b.wav", piper_config=config)
        assert len(a) > 16000 and audio_sha256(a) == audio_sha256(b)
    assert quiet._piper_voice().session.get_session_options().intra_op_num_threads == 1


def test_a_run_labels_what_the_corpus_lacks_before_encoding_what_it_holds(tmp_path, monkeypatch):
    """Features of shards 0-4, the corpus holding 0, 2 and 4: shards 1 and 3 are labelled (and committed) first,
    so a run stopped by its budget has grown the corpus as far as it could."""
    import numpy as np

    from pipelines.distill import shards

    class HeldCorpus:
        def has(self, shard):
            return shard in (0, 2, 4)

    order = []

    def make(shard):
        return [{"kind": "clip", "text": "", "audio": None}], (None if shard in (1, 3) else [[7]])

    def featurise(teacher, items, max_new, labels=None):
        z = np.zeros((1, 1), np.float16)
        return z[None], None, [[1]], labels or [[5]], z.astype(np.int32), z

    monkeypatch.setattr(shards, "featurise", featurise)
    monkeypatch.setattr(shards, "add_labelled", lambda corpus, s, items, labels, made: order.append(("label", s)))
    monkeypatch.setattr(shards, "made", lambda *a: {})
    opts = DistillOptions(main="whisper-base", out=tmp_path)
    lines = []
    assert shards.build_features(opts, None, make, [0, 1, 2, 3, 4], 8, None, lines.append, HeldCorpus()) == 5
    assert [int(ln.split()[1].rstrip(":")) for ln in lines] == [1, 3, 0, 2, 4] and order == [("label", 1), ("label", 3)]
    assert "labelling" in lines[0] and "labels from the corpus" in lines[2]


FORTUNES = """Whatever you do, do it well and do it now.
		-- Anonymous
%
He who hesitates is probably right about something, sooner or later.  The cat
sat there watching the rain all afternoon. Short one.
%
See http://example.org for the whole story of this long sentence here.
%
Go forward ten meters.
"""


def test_fortunes_give_addressed_sentences_drawn_beside_the_descriptions(monkeypatch):
    """A fortune file's sentences (its ``%`` lines between fortunes, lines joined, attributions and sentences
    outside 5-30 plain words or with an address left out, an evaluation set's sentence too) are addressed by
    (fortunes/FILE, md5, index through the file); the corpus's pool draws them about as often as
    descriptions, a sentence in both once."""
    from pipelines import debian
    from pipelines.distill import speech
    from pipelines.distill.speech import corpus_sentences, fortune_sentences

    files = [debian.TextFile("fortunes", "wisdom", "ab" * 16, FORTUNES)]
    told = fortune_sentences({"Go forward ten meters."}, files)
    assert sorted(told.text.values()) == ["He who hesitates is probably right about something, sooner or later.",
                                          "The cat sat there watching the rain all afternoon.",
                                          "Whatever you do, do it well and do it now."]
    assert told.text[("fortunes/wisdom", "ab" * 16, 0)] == "Whatever you do, do it well and do it now."
    assert told.text[("fortunes/wisdom", "ab" * 16, 3)] == "The cat sat there watching the rain all afternoon."
    shared = "The cat sat there watching the rain all afternoon."
    index = [debian.Description(f"pkg{i}", f"{i:032x}", "p", f"Package {i} converts many files quickly. {shared}")
             for i in range(12)]
    monkeypatch.setattr(debian, "read_index", lambda lists_dir=None: index)
    both = corpus_sentences(set(), fortunes=files)
    described = speech.debian_sentences(set())
    assert set(both.text) == set(described.text) | set(told.text)
    pool = both.train + both.heldout
    assert sum(r[0].startswith("fortunes/") for r in pool) > 0
    assert [both.text[r] for r in pool].count(shared) == 1 and ("fortunes/wisdom", "ab" * 16, 3) not in pool
    drawn = [r[0].startswith("fortunes/") for r in both.train]  # about half the draws
    assert 0.3 <= sum(drawn) / len(drawn) <= 0.7


def test_fortune_files_are_read_from_the_unpacked_package(tmp_path):
    """``debian.read_fortunes`` reads the package's fortune files, not their ``.dat`` indexes nor the ``.u8``
    links, each named by the md5 of its text (the .deb already fetched and unpacked here)."""
    import hashlib

    from pipelines import debian

    (tmp_path / "fortunes_1.0_all.deb").write_bytes(b"")
    games = tmp_path / "fortunes_1.0_all" / "usr/share/games/fortunes"
    games.mkdir(parents=True)
    (games / "wisdom").write_text(FORTUNES)
    (games / "wisdom.dat").write_bytes(b"\x00\x01")
    (games / "wisdom.u8").symlink_to("wisdom")
    got = debian.read_fortunes(folder=tmp_path)
    assert got == [debian.TextFile("fortunes", "wisdom", hashlib.md5(FORTUNES.encode()).hexdigest(), FORTUNES)]



def test_a_student_goes_on_from_the_shipped_assistant_on_the_shards_named(sentences, tmp_path, monkeypatch, speech_real):
    """--start shipped --shards 2: the student starts from the shipped layers (not the main model's), reads
    the features of shards 0 and 2 only, drafts the tokens of the whole corpus (shard 1's too) and its card
    says where it started and what it trained on. Where the index holds fortunes out, the run labels as many
    of them as shard 0 holds and measures every checkpoint on both sets."""
    import torch
    from safetensors.torch import load_file

    from pipelines.distill import lineage, speech
    from pipelines.distill.lineage import start_row
    from pipelines.distill.options import parse_shards
    from pipelines.distill.shards import shard_done
    from pipelines.distill.student import StudentDesign, start_folder
    from pipelines.distill.teacher import Teacher
    from pipelines.models.loading import ModelRef

    shipped = start_folder("shipped", ModelRef("embedded", "whisper-base"))
    if not (shipped / "assistant.json").is_file():
        pytest.skip("no distilled assistant shipped yet")
    monkeypatch.setattr(speech, "debian_sentences", lambda exclude, lists_dir=None: sentences)
    told = {("fortunes/wisdom", "ab" * 16, i): t for i, t in enumerate(
        ["Whatever you do, do it well and do it now.", "The cat sat there watching the rain all afternoon."])}
    monkeypatch.setattr(speech, "fortune_sentences", lambda exclude, files=None: Sentences(told, [], sorted(told)))
    corpus = tmp_path / "corpus"
    grow = DistillOptions(main="whisper-base", out=tmp_path / "grow", clips=8, shard_size=4, heldout=2, corpus=corpus,
                          label_only=True)
    assert distill(grow, log=lambda *_: None) is None and corpus_labelled(grow)
    opts = DistillOptions(main="whisper-base", out=tmp_path / "run", shard_size=4, heldout=2, corpus=corpus,
                          start="shipped", shards=(2,), steps=2, batch_size=2, eval_every=1, lr=1e-9)
    design = StudentDesign(Teacher(ModelRef("embedded", "whisper-base"), "float32", "cpu"), opts, [0, 1])
    stored = load_file(shipped / "layers.safetensors")
    state = design.state()
    assert {f"model.decoder.{k}" for k in stored} == set(state)
    assert all(torch.equal(state[f"model.decoder.{k}"], v.float()) for k, v in stored.items())

    was = start_row(json.loads((shipped / "card.json").read_text()))
    assert 2 in parse_shards(was["shards"])  # the shipped one trained on the corpus's first shards
    monkeypatch.setattr(lineage, "start_row", lambda card: {"clips": 100, "steps": 10, "clips_seen": 160,
                                                            "train_seconds": 5.0, "shards": "1,3-5"})
    folder = distill(opts, log=lambda *_: None)
    assert [shard_done(opts.out, s) for s in range(3)] == [True, False, True]
    held = read_shard(opts.out, HELD_OUT_FORTUNES)
    assert len(held.items) == 2 and all(tuple(r) in told for it in held.items for r in it["sentences"])
    assert all(it["labels"] for it in held.items)
    card = json.loads((folder / "card.json").read_text())
    meta = json.loads((folder / "assistant.json").read_text())
    digest = json.loads((shipped / "assistant.json").read_text())["sha256"]
    assert card["start"] == {"folder": "pipelines/assistants/whisper-base-distilled", "sha256": digest}
    before = json.loads((shipped / "card.json").read_text())  # the start's card carries on: its training, newest first
    assert card["history"][0]["training"] == before["training"] and card["history"][0]["curve"] == before["curve"]
    assert card["history"][1:] == before.get("history", [])
    text = (folder / "CARD.md").read_text()
    assert f"## Earlier training: the start, layers sha256 {digest[:12]}" in text
    # its point of the corpus's record, counted over its lineage: the start's distinct clips (its row, here one
    # that never trained on shard 2) and shard 2's 4; steps, clips seen and training seconds add up
    mine = [p for p in card["sizes"] if p.get("role") == "this assistant"]
    assert len(mine) == 1 and (mine[0]["clips"], mine[0]["steps"], mine[0]["clips_seen"]) == (104, 12, 164)
    assert mine[0]["shards"] == "1-5" and mine[0]["train_seconds"] > 5.0
    assert 0 < mine[0]["real"]["agreement"] <= 1 and mine[0]["source"].startswith("went on from whisper-base-distilled")
    assert json.loads((corpus / "curve.json").read_text())["sizes"] == [{k: v for k, v in mine[0].items() if k != "role"}]
    assert card["shipped"]["role"] == "start of this assistant, shipped"
    assert "(the start of this assistant, shipped whisper-base-distilled, its card)" in text
    # the plan names the start's layers: a resume after the shipped assistant changed is refused, not miscounted
    plan = json.loads((opts.out / "plan.json").read_text())
    assert plan["start_sha256"] == digest
    (opts.out / "plan.json").write_text(json.dumps({**plan, "start_sha256": "0" * 64}))
    with pytest.raises(DistillError, match="other options"):
        distill(DistillOptions(**{**opts.__dict__, "resume": True}), log=lambda *_: None)
    assert card["items"] == 4 and card["init_layers"] == meta["init_layers"] == [0, 5]
    shard1 = {t for clip in Corpus(corpus, TEACHER, {}).read(1) for t in clip.labels}
    assert shard1 <= set(meta["draft_vocab"])
    assert all(HELD_OUT_FORTUNES in p for p in card["curve"]) and HELD_OUT_FORTUNES in card["training"]
    assert "fortunes: tokens per call" in (folder / "CARD.md").read_text()
    assert "4 training items (corpus shards 2)" in (folder / "CARD.md").read_text()
    assert "trained on from the assistant" in (folder / "CARD.md").read_text()
    # (lr 1e-9: the exported layers are the shipped ones to bfloat16's precision)
    exported = load_file(folder / "layers.safetensors")
    assert all(torch.allclose(exported[k].float(), v.float(), atol=1e-2) for k, v in stored.items())


def test_an_assistants_own_row_is_found_beside_its_start():
    """``start_row``: the card's own row ("this assistant", "this assistant, shipped"), never its start's row
    ("start of this assistant, shipped", sorted first); without one, its items, steps and training shards."""
    from pipelines.distill.lineage import start_row

    held = {"agreement": 0.8, "tokens_per_call": 3.5}
    start = {"clips": 20224, "steps": 3792, "clips_seen": 60672, "heldout": held, "role": "start of this assistant, shipped"}
    own = {"clips": 25472, "steps": 4808, "clips_seen": 76928, "heldout": held, "shards": "1-398"}
    for role in ("this assistant", "this assistant, shipped"):
        row = start_row({"sizes": [start, {**own, "role": role}], "options": {"clips": 4000, "shard_size": 64}})
        assert (row["clips"], row["steps"], row["shards"]) == (25472, 4808, "1-398")
    bare = start_row({"items": 8128, "training": {"distinct_clips": 8000, "step": 900, "clips_seen": 14400},
                      "options": {"shards": [4, 11, 317, 318], "steps": None}, "sizes": [start]})
    assert (bare["clips"], bare["steps"], bare["shards"]) == (8128, 900, "4,11,317-318")


def test_the_best_checkpoint_weighs_both_heldout_sets_alike():
    """The best checkpoint has the most tokens per main call averaged over shard 0 and the held-out fortunes;
    a point measured on shard 0 alone (a run resumed after its fortunes were built) is compared on shard 0."""
    from pipelines.distill.heldout import is_better

    steady = {"tokens_per_call": 4.0, HELD_OUT_FORTUNES: {"tokens_per_call": 3.6}}
    traded = {"tokens_per_call": 3.95, HELD_OUT_FORTUNES: {"tokens_per_call": 3.8}}
    assert is_better(steady, None) and is_better(traded, steady) and not is_better(steady, traded)
    assert not is_better({"tokens_per_call": 4.0, HELD_OUT_FORTUNES: {"tokens_per_call": 3.2}}, steady)
    assert not is_better(traded, {"tokens_per_call": 4.0}) and is_better({"tokens_per_call": 4.1}, steady)
    assert not is_better({"tokens_per_call": 3.9}, steady)  # shard 0 alone: 3.9 < 4.0, whatever the fortunes
    assert is_better({"tokens_per_call": 4.05, HELD_OUT_FORTUNES: {"tokens_per_call": 3.0}}, {"tokens_per_call": 4.0})


def test_held_out_fortunes_wait_when_the_budget_is_spent(tmp_path):
    """A run past its deadline labels no fortunes (``--resume`` does) and says so."""
    from pipelines.distill.heldout import build_fortunes

    said = []
    never = object()  # a teacher, sentences or speaker touched here would fail loudly
    assert not build_fortunes(tmp_path, never, never, never, tmp_path, 96, time.time() - 1, said.append)
    assert said and "--resume" in said[0] and not list(tmp_path.iterdir())
