"""The embedded text pair with ``--dtype q4_k_m``: the 1.5B main model is its GGUF file on llama.cpp
(``models/llamacpp.py``, ``engine/llamacpp.py``). A verify pass gives each token the logits of plain steps bit
for bit (drafts of every length, a pass split in two, rejected drafts rewritten); assisted summaries and
translations equal plain ones token for token. Needs the `text` extra and llama-cpp-python (the `gguf` extra):
skipped with the reason otherwise."""

from importlib.util import find_spec

import pytest
import torch
from test_quantize import verify_pass_and_plain_steps
from test_text_qwen import DOCUMENT, pytestmark as text_marks
from test_text_qwen_quantized import summary_and_translation_assisted_equal_plain

from pipelines.devices import DeviceError, resolve_dtype
from pipelines.models.loading import ModelUnavailableError
from pipelines.models.pairs import load_pair
from pipelines.models.registry import RegistryError, load_registry
from pipelines.text import TextRunner

pytestmark = text_marks + [
    pytest.mark.skipif(find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed: pip install -e '.[gguf]'"),
]


@pytest.fixture(scope="module")
def summarizer():
    try:
        return TextRunner(load_registry().get("qwen2.5-coder-1.5b+0.5b-summarize"), "q4_k_m")
    except ModelUnavailableError as e:  # no exact pass layout on this CPU's build (test_llamacpp_widths checks that)
        if "no pass layout" not in str(e):
            raise
        pytest.skip(str(e))


def test_the_main_model_is_the_gguf_file_on_llamacpp(summarizer):
    loaded = summarizer.loaded
    assert loaded.dtype == "q4_k_m" and type(loaded.main).__name__ == "LlamaCppDecoder"
    assert loaded.main_model.path.name == "model.gguf" and loaded.main_model.path.stat().st_size > 10**9


# copies: 4 copies of the document make a prompt of over 256 tokens, so attention reads 512 cached positions
# (llama.cpp pads the cache it attends to by 256), where a float16 cache would sum a lone query another way
@pytest.mark.parametrize("copies", [1, 4])
@pytest.mark.parametrize("words", [1, 3, 7])  # passes of 2, of 3 + 1, and of 3 + 3 + 2 tokens
def test_one_verify_pass_gives_the_logits_of_plain_steps(summarizer, words, copies):
    prompt = summarizer.chat_prompts("summarize", " ".join([DOCUMENT] * copies))[0]
    assert copies == 1 or len(prompt) > 256
    drafts = summarizer.tok.encode(" The city council agreed to fund new parks and a library.")[:words]
    verify, plain = verify_pass_and_plain_steps(summarizer.loaded.main, prompt, drafts, pad=0,
                                                capacity=len(prompt) + 16)
    assert torch.equal(verify, plain)


def test_a_rejected_draft_leaves_no_trace(summarizer):
    """Two verify passes whose second half was rejected, then the true tokens: the same logits as plain steps."""
    dec, pad = summarizer.loaded.main, 0
    prompt = summarizer.chat_prompts("summarize", DOCUMENT)[0]
    true = summarizer.tok.encode(" The council met.")[:4]
    _, plain = verify_pass_and_plain_steps(dec, prompt, true, pad=pad, capacity=len(prompt) + 16)
    cache = dec.new_cache(1, len(prompt) + 16)
    first, _ = dec.forward([prompt + true[:1] + [9, 9, 9]], cache, None, pad, need_from=[len(prompt) - 1])
    cache.commit_prefix([len(prompt) + 1], 0)  # the prompt and the first token kept; the wrong drafts dropped
    rest, _ = dec.forward([true[1:]], cache, None, pad)
    got = torch.cat([first[0, len(prompt) - 1 : len(prompt) + 1], rest[0]])
    assert torch.equal(got, plain)


def test_summary_and_translation_assisted_equal_plain(summarizer):
    summary_and_translation_assisted_equal_plain(summarizer)


def test_q4_k_m_is_refused_before_loading_where_it_cannot_run():
    registry = load_registry()
    with pytest.raises(RegistryError, match="GGUF"):
        load_pair(registry.get("whisper-base"), "q4_k_m")
    with pytest.raises(DeviceError, match="CPU only"):
        resolve_dtype("cuda:0", "q4_k_m", "bfloat16")
