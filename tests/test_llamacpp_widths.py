"""``engine.llamacpp``'s pass widths on a stand-in for llama.cpp (no weights, no llama-cpp-python): which widths
``exact_widths`` accepts for three kinds of kernels, and how ``LlamaCppDecoder.forward`` cuts and pads passes
from them. The real model's property (a verify pass equals plain steps bit for bit) is tests/test_text_qwen_gguf.py's."""

from types import SimpleNamespace

import numpy as np
import pytest

from pipelines.engine.llamacpp import LlamaCppDecoder, exact_widths
from pipelines.models.loading import ModelUnavailableError

VOCAB = 8


class FakeContext:
    """Logits that are a function of (token, position), shifted by ``shift(width, column)``: the bits a kernel
    gives a token in that column of a pass of that width. Records each call's (tokens, start, outputs)."""

    def __init__(self, shift, n_ctx=256):
        self.shift, self.n_ctx, self.max_tokens, self.calls = shift, n_ctx, 512, []

    def clear(self):
        pass

    def forget_from(self, position):
        pass

    def close(self):
        pass

    def decode(self, tokens, start, outputs, last=False):
        self.calls.append((list(tokens), start, "last" if last else outputs))
        read = [len(tokens) - 1] if last else range(outputs)
        if not read:
            return None
        rows = [(np.arange(VOCAB) * (tokens[i] + 1) + start + i) / 7.0 + self.shift(len(tokens), i) for i in read]
        return np.array(rows, dtype=np.float32)


def fake_model(shift):
    contexts = []

    def new_context(n_ctx):
        contexts.append(FakeContext(shift, n_ctx))
        return contexts[-1]

    config = SimpleNamespace(max_position_embeddings=64, vocab_size=VOCAB)
    return SimpleNamespace(new_context=new_context, config=config, vocab_size=VOCAB, contexts=contexts)


KERNELS = {  # bits by width and column, the widths found with high 3 and high 6
    "columns alone below 4 (AMD EPYC)": (lambda w, i: 0.0 if w < 4 else 1e-3, (1, 3), (1, 3)),
    "another kernel for 1 column (AMX)": (lambda w, i: 1e-3 if w == 1 else 0.0, (2, 3), (2, 6)),
    "every width its own bits": (lambda w, i: 1e-3 * w, (2, 2), (2, 2)),
}


@pytest.mark.parametrize("kernel", KERNELS)
def test_exact_widths_keeps_only_widths_that_agree(kernel):
    shift, upto3, upto6 = KERNELS[kernel]
    assert exact_widths(fake_model(shift)) == upto3
    assert exact_widths(fake_model(shift), high=6) == upto6


@pytest.mark.parametrize("shift", [lambda w, i: 1e-3 * i, lambda w, i: 1e-3 * w + 1e-4 * i],
                         ids=["columns differ", "widths and columns differ"])
def test_no_exact_layout_refuses_the_dtype(shift):
    with pytest.raises(ModelUnavailableError, match="use --dtype bfloat16"):
        exact_widths(fake_model(shift))


def test_passes_are_cut_at_high_and_padded_to_low():
    narrow = LlamaCppDecoder(fake_model(KERNELS["columns alone below 4 (AMD EPYC)"][0]))
    padded = LlamaCppDecoder(fake_model(KERNELS["another kernel for 1 column (AMX)"][0]))
    assert (narrow.low, narrow.high, narrow.narrow_passes) == (1, 3, True)
    assert (padded.low, padded.high, padded.narrow_passes) == (2, 3, False)
    for decoder, widths in ((narrow, [3, 3, 1, 1]), (padded, [3, 3, 2, 2])):
        cache = decoder.new_cache(1, 32)
        ctx = cache.contexts[0]
        ctx.calls.clear()
        # a prompt of 2 tokens and 6 drafts (3 + 3), then two plain steps
        logits, real = decoder.forward([[1, 2, 3, 4, 5, 6, 7, 8]], cache, None, pad_id=0, need_from=[1])
        assert ctx.calls[0] == ([1, 2], 0, "last")  # the prompt call gives the last prompt token's logits
        assert logits[0, 0].abs().sum() == 0 and logits[0, 1].abs().sum() > 0
        cache.commit(real)
        step, _ = decoder.forward([[9]], cache, None, pad_id=0)
        step2, _ = decoder.forward([[10]], cache, None, pad_id=0)
        assert [len(tokens) for tokens, _, _ in ctx.calls[1:]] == widths
        assert all(outputs == len(tokens) for tokens, _, outputs in ctx.calls[1:])  # every column's logits read
        assert real.all() and logits.shape == (1, 8, VOCAB) and step.shape == (1, 1, VOCAB)
