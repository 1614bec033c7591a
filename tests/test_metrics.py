import pytest

from pipelines.quality import metrics


@pytest.mark.parametrize(
    "hyp, ref, expected",
    [
        ("the cat sat on the mat", "the cat sat on the mat", 0.0),
        ("the cat sat", "the cat sat on the mat", 0.5),  # 3 deletions / 6 words
        ("the dog sat on the mat", "the cat sat on the mat", 1 / 6),
        ("Ten of clubs.", "ten of clubs", 0.0),  # Whisper's normaliser: case, punctuation
        ("Go forward 10 meters.", "go forward ten meters", 0.0),  # and numbers
        ("Mr. Smith", "mister smith", 0.0),
    ],
)
def test_wer_known_values(hyp, ref, expected):
    assert metrics.wer([hyp], [ref]).value == pytest.approx(expected)


def test_wer_is_corpus_level_and_signed():
    score = metrics.wer(["a b c", "d"], ["a b c", "x y z"])
    assert score.value == pytest.approx(3 / 6)  # 1 sub + 2 del over 6 reference words
    assert score.signature.startswith("metric:wer|norm:whisper-en|jiwer:")
    assert score.n == 2


def test_basic_normaliser_for_other_languages():
    score = metrics.wer(["Guten Tag, Welt!"], ["guten tag welt"], language="de")
    assert score.value == 0.0 and "norm:whisper-basic" in score.signature


def test_cer_known_value():
    assert metrics.cer(["abc"], ["abd"]).value == pytest.approx(1 / 3)


def test_bleu_and_chrf_known_values():
    assert metrics.bleu(["the cat is on the mat"], ["the cat is on the mat"]).value == pytest.approx(100.0)
    assert metrics.bleu(["completely different words here"], ["the cat is on the mat"]).value == pytest.approx(0.0)
    chrf = metrics.chrf(["hello world"], ["hello world"])
    assert chrf.value == pytest.approx(100.0)
    assert "nc:6" in chrf.signature and "version:" in chrf.signature


def test_rouge_known_values():
    scores = metrics.rouge(["the cat sat"], ["the cat sat on the mat"])
    assert scores["rouge1"].value == pytest.approx(2 * 1.0 * 0.5 / 1.5)  # P=1, R=0.5
    assert scores["rouge2"].value == pytest.approx(2 * 1.0 * 0.4 / 1.4)  # 2 of 5 bigrams
    assert "rouge-score:" in scores["rougeL"].signature


def test_mismatched_lengths_and_empty_input():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        metrics.wer(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="nothing to score"):
        metrics.bleu([], [])
