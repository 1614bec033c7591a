"""The embedded text pair (Qwen2.5-Coder 1.5B + 0.5B) with int8 weights (``models/quantize.py``): one verify
pass gives each token the logits of plain steps bit for bit, and assisted summaries and translations equal plain
ones token for token, in that dtype. Marked ``text_weights`` like test_text_qwen.py (needs the `text` extra)."""

from dataclasses import replace

import pytest
import torch
from test_quantize import verify_pass_and_plain_steps
from test_text_qwen import DOCUMENT, pytestmark  # noqa: F401  (the marker and skip: the same pair and text)

from pipelines.models.pairs import engine_for
from pipelines.models.quantize import WeightOnlyLinear, quantized
from pipelines.models.registry import load_registry
from pipelines.text import TextOptions, TextRunner


@pytest.fixture(scope="module")
def summarizer():
    return TextRunner(load_registry().get("qwen2.5-coder-1.5b+0.5b-summarize"), "int8")


def test_the_main_models_linears_are_int8(summarizer):
    model = summarizer.loaded.main_model
    assert quantized(model).dtype == "int8" and summarizer.loaded.dtype == "int8"
    assert isinstance(model.model.layers[0].mlp.down_proj, WeightOnlyLinear)
    assert model.dtype == torch.bfloat16 or model.dtype == torch.float32  # the compute dtype


def test_one_verify_pass_gives_the_logits_of_plain_steps(summarizer):
    prompt = summarizer.chat_prompts("summarize", DOCUMENT)[0]
    drafts = summarizer.tok.encode(" The city council agreed to fund parks.")[:6]
    verify, plain = verify_pass_and_plain_steps(summarizer.loaded.main, prompt, drafts, pad=0,
                                                capacity=len(prompt) + 16)
    assert torch.equal(verify, plain)


def summary_and_translation_assisted_equal_plain(summarizer):
    """A summary and a two-sentence translation with the assistant equal plain decoding in ``summarizer``'s
    dtype (the translate pair reuses its loaded models). Returns the summary."""
    summary = summarizer.summarize(DOCUMENT, TextOptions(compare=True, max_new_tokens=24))
    assert summary.identical is True and summary.drafted > 0 and summary.tokens >= 12
    pair = load_registry().get("qwen2.5-coder-1.5b+0.5b-translate")
    loaded = summarizer.loaded  # the same models: no second load
    runner = TextRunner(pair, loaded=replace(loaded, pair=pair, engine=engine_for(loaded, pair.draft)))
    result = runner.translate("The train leaves at seven. Where is the library?",
                              TextOptions(src="en", tgt="de", compare=True, max_new_tokens=16, batch_size=2))
    assert result.rows == 2 and result.identical is True and "Zug" in result.output
    return summary


def test_summary_and_translation_assisted_equal_plain(summarizer):
    summary = summary_and_translation_assisted_equal_plain(summarizer)
    assert "council" in summary.output.lower() or "budget" in summary.output.lower()
