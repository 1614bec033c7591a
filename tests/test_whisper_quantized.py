"""Whisper base's decoders with int8/int4 weights (``models/quantize.py``, ``--dtype int8|int4``) on the real
embedded weights: only the decoders' linears are quantized (the encoder and the head keep the compute dtype),
every product of a request has a row count fixed by its pass's shape (so the kernel-or-dense choice of
``DENSE_ROWS`` cannot differ between a plain step and a verify pass), one verify pass gives each token the
logits of plain steps bit for bit, and assisted transcripts equal plain ones token for token."""

import random

import pytest
import torch
from test_engine_whisper import _plain_run, _scheduled_run, windows  # noqa: F401  (windows: a fixture)
from whisper_base import causal_lm, distilled_shipped, whisper_base

from pipelines.devices import compute_dtype
from pipelines.engine import as_decoder
from pipelines.engine.cache import EncoderOutput
from pipelines.engine.whisper import step_shape
from pipelines.models.quantize import DENSE_ROWS, WeightOnlyLinear, quantize_model, quantized

LINEARS_PER_LAYER = 10  # self-attention q, k, v, out; cross-attention q, k, v, out; fc1, fc2


def compute() -> torch.dtype:
    """The dtype int8/int4 products run in on this CPU (``devices.compute_dtype``)."""
    return getattr(torch, compute_dtype("cpu", "int8"))


def quantized_base(dtype: str, dense_rows: int | None = None):
    """The embedded Whisper base in the compute dtype, its decoder's linears in ``dtype``."""
    model = whisper_base(compute())
    assert quantize_model(model, dtype, dense_rows=dense_rows) == LINEARS_PER_LAYER * len(model.model.decoder.layers)
    return model


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_only_the_decoders_linears_are_quantized(dtype):
    model = quantized_base(dtype)
    assert quantized(model).dtype == dtype
    layer = model.model.decoder.layers[0]
    for module in (layer.self_attn.q_proj, layer.encoder_attn.k_proj, layer.fc1, layer.fc2):
        assert isinstance(module, WeightOnlyLinear)
    encoder = model.model.encoder.layers[0]
    assert type(encoder.fc1) is torch.nn.Linear and type(encoder.self_attn.q_proj) is torch.nn.Linear
    assert type(model.proj_out) is torch.nn.Linear  # the head, tied to the embeddings
    assert model.dtype == compute()


@pytest.mark.parametrize("dtype, dense_passes", [
    ("int8", False),  # the 4 x 12-token prompt pass on dequantized weights (DENSE_ROWS 32), the passes on the kernel
    ("int4", False),  # the prompt pass and the passes on the kernel (DENSE_ROWS 96)
    pytest.param("int4", True, marks=pytest.mark.slow),  # every product on dequantized weights
])
def test_verify_passes_have_the_bits_of_plain_steps(windows, dtype, dense_passes, monkeypatch):  # noqa: F811
    """Random lookahead schedules (0 to 8 drafts a row and round, wrong drafts included) over three real clips
    and a dense long-form window with a previous-text prompt: every token's logits have the bits of plain
    one-token steps. And every quantized product had a row count its pass's shape fixes (rows x width, rows x
    the prompt pass's width, rows x encoder frames for the cross-attention keys and values), never one that
    depends on how many of its columns were real: the kernel-or-dense choice is the same for a plain step and a
    verify pass."""
    x, prompts = windows
    rows, width = len(prompts), step_shape(compute()).width_for(len(prompts))
    dense = rows * width if dense_passes else DENSE_ROWS[dtype]
    decoder = as_decoder(quantized_base(dtype, dense))
    with torch.inference_mode():
        enc = decoder.encode(input_features=x)
    seen: list[int] = []
    forward = WeightOnlyLinear.forward
    monkeypatch.setattr(WeightOnlyLinear, "forward", lambda self, t: seen.append(t.numel() // t.shape[-1]) or forward(self, t))
    tokens, logits = _plain_run(decoder, enc, prompts, 24)
    assert len(tokens[3]) == 24  # the long window is dense speech
    rounds = _scheduled_run(decoder, enc, prompts, tokens, logits, random.Random(3))
    assert rounds < max(map(len, tokens))  # drafts were accepted: fewer rounds than tokens
    prompt_width = max(map(len, prompts)) - 1  # the prompt pass: every token but the last
    shapes = {rows * width, rows * prompt_width, rows * enc.hidden.shape[1]}
    assert set(seen) == shapes, (set(seen), shapes)
    assert (rows * width >= dense) == dense_passes  # the passes took the path the case names


def test_a_quantized_assistant_drafts_through_its_own_modules():
    """A pair without the lean int8 assistant quantizes its assistant like the main model; the lean draft decoder
    then runs the quantized modules (in the compute dtype) and drafts close to the float drafter."""
    name = "whisper-base-distilled" if distilled_shipped() else "whisper-base-decoder-2l"
    float_draft = as_decoder(causal_lm(name, compute()), assistant=True, int8=False)
    model = causal_lm(name, compute())
    quantize_model(model, "int8")
    draft = as_decoder(model, assistant=True, int8=True)  # (int8 dynamic weights are ignored: already int8)
    assert draft.dtype == compute() and not draft.int8
    hidden = torch.randn(1, 1500, model.config.d_model, generator=torch.Generator().manual_seed(0)).to(compute())
    ids = torch.tensor([[50258, 50259, 50359, 50363, 440, 1029]])
    real = torch.ones_like(ids, dtype=torch.bool)
    with torch.inference_mode():
        got, _ = draft.forward_ids(ids, real, draft.new_cache(1), EncoderOutput(hidden, None))
        want, _ = float_draft.forward_ids(ids, real, float_draft.new_cache(1), EncoderOutput(hidden, None))
    close = torch.nn.functional.cosine_similarity(got[0], want[0], dim=-1)
    assert close.min() > 0.98, close


@pytest.mark.parametrize("dtype, pair_name", [
    ("int8", "whisper-base+distilled"),  # the shipped pair: its lean int8 assistant, the main decoder in int8
    pytest.param("int4", "whisper-base+own-decoder", marks=pytest.mark.slow),  # its assistant quantized too
])
def test_assisted_transcripts_equal_plain(registry, speech_real, dtype, pair_name):
    """End to end through the ASR pipeline, four real clips, four at a time: every transcript's tokens equal
    plain decoding's in that dtype."""
    if pair_name.endswith("distilled") and not distilled_shipped():
        pytest.skip("the distilled assistant is not shipped")
    from pipelines.asr import TranscribeOptions, WhisperRunner, transcribe

    pair = registry.get(pair_name)
    runner = WhisperRunner(pair, dtype)
    assert runner.loaded.dtype == dtype and quantized(runner.model).dtype == dtype
    paths = [i["audio_path"] for i in speech_real[:4]]
    results = list(transcribe(paths, pair, TranscribeOptions(dtype=dtype, compare=True, batch_size=4), runner))
    assert all(r.identical for r in results), [r.path for r in results if not r.identical]
    assert sum(r.accepted for r in results) > 0 and all(r.text for r in results)
