"""Word timestamps against openai-whisper itself (pipelines/quality/words_reference.py): the checkpoint
conversion, the pairing of segments, and (slow) issue 52's bars on speech-real. The checks that run whisper's
code skip where openai-whisper is not installed (``pip install --no-deps openai-whisper==20250625 tiktoken
numba``: not a dependency, its package pulls triton)."""

from __future__ import annotations

import pytest
import torch

from pipelines.asr.options import Segment, Word
from pipelines.quality import words_reference as R


def test_conversion_gives_transformers_logits():
    pytest.importorskip("whisper")
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=300, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                           decoder_ffn_dim=128, max_source_positions=20, max_target_positions=16,
                           pad_token_id=1, bos_token_id=2, eos_token_id=3, decoder_start_token_id=4)
    hf = WhisperForConditionalGeneration(config).eval()
    model = R.whisper_model(hf)
    mel, tokens = torch.randn(1, 8, 40), torch.tensor([[1, 5, 7, 9, 200]])
    with torch.no_grad():
        want = hf(input_features=mel, decoder_input_ids=tokens).logits
        got = model(mel, tokens)
    assert torch.allclose(got, want, atol=1e-4)
    assert model.alignment_heads.to_dense().nonzero().tolist() == [[1, 0], [1, 1], [1, 2], [1, 3]]


def _seg(text: str, *words: tuple[str, float, float]) -> Segment:
    return Segment(words[0][1], words[-1][2], text, words=tuple(Word(s, e, w, 0.9) for w, s, e in words))


def test_transcripts_are_compared_on_segments_of_the_same_text():
    ours = [_seg("Hello there.", (" Hello", 0.0, 0.4), (" there.", 0.4, 0.9)),
            _seg("Not theirs.", (" Not", 1.0, 1.2), (" theirs.", 1.2, 1.6)),
            _seg("Go on.", (" Go", 2.0, 2.2), (" on.", 2.2, 2.5))]
    theirs = [dict(text=" Hello there.", words=[dict(word=" Hello", start=0.02, end=0.4),
                                                 dict(word=" there.", start=0.4, end=1.0)]),
              dict(text="", words=[]),  # whisper's emptied segment
              dict(text=" Different.", words=[dict(word=" Different.", start=1.0, end=1.6)]),
              dict(text=" Go on.", words=[dict(word=" Go", start=2.0, end=2.21), dict(word=" on.", start=2.21, end=2.5)])]
    gaps = R.compare_transcripts(ours, theirs)
    assert (gaps.segments, gaps.segments_total, gaps.words, gaps.same_words) == (2, 3, 4, 4)
    assert (gaps.within_fine, gaps.within_coarse, gaps.max_gap) == (3, 4, 0.1)
    assert gaps.worst[0] == (0.1, " there.", "0.40-0.90", "0.40-1.00")


@pytest.mark.slow
def test_words_agree_with_openai_whisper_on_speech_real(tmp_path):
    """Issue 52's bar on the method: whisper's add_word_timestamps on Tandem's windows and features gives the
    same words, 95% within 0.02 s and all within 0.1 s."""
    pytest.importorskip("whisper")
    report = R.main(["--set", "speech-real", "--layers", "method", "--json", str(tmp_path / "words.json")])
    total = report["totals"]["method"]
    assert total["words"] >= 100 and total["same_words"] == total["words"]
    assert total["within_fine"] >= 0.95 * total["words"] and total["within_coarse"] == total["words"]
