"""Quality metrics from the libraries themselves, each score carrying a signature to reproduce it.

- WER / CER: jiwer, on text normalised by Whisper's English normaliser (English) or its basic
  normaliser (other languages);
- BLEU / chrF: sacrebleu (its own signature, extended with the library version);
- ROUGE-1/2/L: rouge-score, F-measure averaged over documents.

A signature looks like sacrebleu's: ``metric:wer|norm:whisper-en|jiwer:4.0.0|whisper-normalizer:0.1.15``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.metadata import version


@dataclass(frozen=True)
class Score:
    """One corpus-level score."""

    name: str  # "wer", "cer", "bleu", "chrf", "rouge1", "rouge2", "rougeL"
    value: float  # WER/CER as a fraction (0.05 = 5%); BLEU/chrF 0-100; ROUGE F-measure 0-1
    signature: str  # everything needed to reproduce the number
    n: int  # how many (hypothesis, reference) pairs were scored

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "signature": self.signature, "n": self.n}


def _check_lengths(hyps: list[str], refs: list[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        raise ValueError("nothing to score: no hypotheses")


@cache
def _normalizer(language: str | None):
    if language in ("en", "english", None):
        from whisper_normalizer.english import EnglishTextNormalizer

        return "whisper-en", EnglishTextNormalizer()
    from whisper_normalizer.basic import BasicTextNormalizer

    return "whisper-basic", BasicTextNormalizer()


def normalize(text: str, language: str | None = "en") -> str:
    """Whisper's English normaliser for English ("Ten" -> "10", "Mr." -> "mister"), else the basic one."""
    return _normalizer(language)[1](text)


def _edit_rate(kind: str, hyps: list[str], refs: list[str], language: str | None) -> Score:
    import jiwer

    _check_lengths(hyps, refs)
    norm_name, norm = _normalizer(language)
    h = [norm(x) for x in hyps]
    r = [norm(x) for x in refs]
    # jiwer refuses empty references; an empty reference scores as one "word" so insertions still count.
    r = [x if x.strip() else "<empty>" for x in r]
    h = [x if x.strip() else "" for x in h]
    fn = jiwer.wer if kind == "wer" else jiwer.cer
    value = float(fn(r, h))
    sig = f"metric:{kind}|norm:{norm_name}|jiwer:{version('jiwer')}|whisper-normalizer:{version('whisper-normalizer')}"
    return Score(kind, value, sig, len(hyps))


def wer(hyps: list[str], refs: list[str], language: str | None = "en") -> Score:
    """Word error rate: (substitutions + deletions + insertions) / reference words, over the corpus."""
    return _edit_rate("wer", hyps, refs, language)


def cer(hyps: list[str], refs: list[str], language: str | None = "en") -> Score:
    """Character error rate, the same edit distance over characters."""
    return _edit_rate("cer", hyps, refs, language)


def bleu(hyps: list[str], refs: list[str], tokenize: str | None = None) -> Score:
    """Corpus BLEU (sacrebleu defaults: 13a tokenizer, exp smoothing); pass tokenize="zh"/"ja-mecab" etc."""
    from sacrebleu.metrics import BLEU

    _check_lengths(hyps, refs)
    metric = BLEU(tokenize=tokenize) if tokenize else BLEU()
    value = metric.corpus_score(hyps, [refs]).score
    return Score("bleu", float(value), f"metric:bleu|{metric.get_signature()}", len(hyps))


def chrf(hyps: list[str], refs: list[str]) -> Score:
    """Corpus chrF (character n-gram F-score, sacrebleu defaults: n=6, beta=2)."""
    from sacrebleu.metrics import CHRF

    _check_lengths(hyps, refs)
    metric = CHRF()
    value = metric.corpus_score(hyps, [refs]).score
    return Score("chrf", float(value), f"metric:chrf|{metric.get_signature()}", len(hyps))


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge(hyps: list[str], refs: list[str], use_stemmer: bool = True) -> dict[str, Score]:
    """ROUGE-1/2/L F-measure averaged over documents (rouge-score, Porter stemmer on)."""
    from rouge_score import rouge_scorer

    _check_lengths(hyps, refs)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=use_stemmer)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for h, r in zip(hyps, refs):
        for name, s in scorer.score(r, h).items():
            totals[name] += s.fmeasure
    sig = f"stem:{'yes' if use_stemmer else 'no'}|avg:docs|rouge-score:{version('rouge-score')}"
    return {name: Score(name, totals[name] / len(hyps), f"metric:{name}|{sig}", len(hyps)) for name in ROUGE_TYPES}
