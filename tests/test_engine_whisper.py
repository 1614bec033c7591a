"""Exactness on real weights: the engine's output equals Whisper base's own greedy ``generate``, token for
token, over the real speech set, for every drafter, policy and batch size."""

import pytest
import torch

from pipelines.embedded import embedded_path
from pipelines.engine import (
    AssistedDecoder, DecodeOptions, PolicyOptions, as_decoder, model_drafter, rules_from_generation_config,
)

PROMPT = [50258, 50259, 50359, 50363]  # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
EOT = 50257
MAX_NEW = 440


@pytest.fixture(scope="module")
def setup(speech_real):
    from transformers import WhisperFeatureExtractor, WhisperForCausalLM, WhisperForConditionalGeneration

    from pipelines.audio import load_audio

    base = embedded_path("whisper-base")
    main = WhisperForConditionalGeneration.from_pretrained(base, dtype=torch.float32).eval()
    fe = WhisperFeatureExtractor.from_pretrained(base)
    x = torch.cat([fe(load_audio(i["audio_path"]), sampling_rate=16000, return_tensors="pt").input_features
                   for i in speech_real])
    with torch.inference_mode():
        refs = [main.generate(x[i : i + 1], language="en", task="transcribe", do_sample=False, num_beams=1,
                              max_new_tokens=MAX_NEW)[0].tolist() for i in range(len(x))]
    decoder = as_decoder(main)
    enc = decoder.encode(input_features=x)  # once: every configuration below reuses it
    own = WhisperForCausalLM.from_pretrained(embedded_path("whisper-base-decoder"), dtype=torch.float32).eval()
    short = WhisperForCausalLM.from_pretrained(embedded_path("whisper-base-decoder-2l"), dtype=torch.float32).eval()
    rules = rules_from_generation_config(main.generation_config, len(PROMPT), MAX_NEW)
    drafters = {
        "none": None,
        "own-decoder": model_drafter(as_decoder(own), share_encoder=True, pad_id=EOT),
        "truncated-2l": model_drafter(as_decoder(short), share_encoder=True, pad_id=EOT),
    }
    if _distilled_shipped():
        distilled = WhisperForCausalLM.from_pretrained(embedded_path("whisper-base-distilled"), dtype=torch.float32).eval()
        drafters["distilled"] = model_drafter(as_decoder(distilled), share_encoder=True, pad_id=EOT)
        # the way pairs load it: the lean draft forward, with and without int8 weights
        drafters["distilled-lean"] = model_drafter(as_decoder(distilled, assistant=True), share_encoder=True, pad_id=EOT)
        drafters["distilled-int8"] = model_drafter(as_decoder(distilled, assistant=True, int8=True), share_encoder=True, pad_id=EOT)
    return decoder, enc, refs, rules, drafters


def _distilled_shipped() -> bool:
    from pipelines.embedded import ASSISTANTS_DIR

    return (ASSISTANTS_DIR / "whisper-base-distilled" / "assistant.json").is_file()


def _run(setup, drafter, policy, batch):
    decoder, enc, refs, rules, drafters = setup
    engine = AssistedDecoder(decoder, drafters[drafter], pad_id=EOT)
    outs, stats = [], []
    for s in range(0, len(refs), batch):
        rows = list(range(s, min(s + batch, len(refs))))
        result = engine.generate([PROMPT] * len(rows), rules, DecodeOptions(max_new_tokens=MAX_NEW, policy=policy),
                                 encoder_output=enc.select(torch.tensor(rows)))
        outs += [list(t) for t in result.tokens]
        stats.append(result.stats)
    return outs, stats


def _strip_eot(tokens):
    return tokens[:-1] if tokens and tokens[-1] == EOT else tokens


@pytest.mark.parametrize(
    "drafter, policy, batch",
    [
        ("none", PolicyOptions("constant", 1), 1),
        ("none", PolicyOptions("constant", 1), 5),
        ("own-decoder", PolicyOptions("constant", 5), 1),
        ("own-decoder", PolicyOptions("constant", 8), 4),
        ("own-decoder", PolicyOptions("heuristic", 2), 12),
        ("truncated-2l", PolicyOptions("constant", 1), 1),
        ("truncated-2l", PolicyOptions("confidence", 4, 6, 0.4), 3),
        ("truncated-2l", PolicyOptions("adaptive", 3), 4),
        ("distilled", PolicyOptions("constant", 5), 1),
        ("distilled", PolicyOptions("adaptive"), 6),
        ("distilled-lean", PolicyOptions("constant", 2), 1),
        ("distilled-int8", PolicyOptions("constant", 3), 5),
        ("distilled-int8", PolicyOptions("adaptive", 2), 1),
    ],
)
def test_identical_to_whisper_generate(setup, drafter, policy, batch):
    refs = setup[2]
    if drafter not in setup[4]:
        pytest.skip("the distilled assistant is not shipped")
    outs, stats = _run(setup, drafter, policy, batch)
    assert [_strip_eot(o) for o in outs] == refs
    assert all(o[-1] == EOT for o in outs)  # every clip ended by itself, not by the length cap
    total = sum(s.new_tokens for s in stats)
    assert total == sum(len(o) for o in outs)
    if drafter == "own-decoder":
        # the assistant is the main decoder itself: every draft is accepted
        assert sum(s.accepted for s in stats) == sum(s.drafted for s in stats) > 0
    if drafter == "none":
        assert sum(s.drafted for s in stats) == 0
    if drafter.startswith("distilled") and policy.name == "constant":
        # the shipped assistant drafts over its reduced vocabulary; at lookahead 5 on real speech it gains about
        # 2.8 tokens per main call (an untrained 2-layer cut gains about 1.0)
        assert sum(s.new_tokens for s in stats) >= 2.0 * sum(s.row_calls for s in stats)


def test_encoder_runs_once_and_is_shared(setup):
    decoder, enc, refs, rules, drafters = setup
    from pipelines.audio import load_audio  # noqa: F401  (the features come from the fixture)

    engine = AssistedDecoder(decoder, drafters["own-decoder"], pad_id=EOT)
    x = torch.zeros(2, 80, 3000)
    result = engine.generate([PROMPT] * 2, rules, DecodeOptions(max_new_tokens=8), encoder_inputs={"input_features": x})
    assert result.stats.encoder_calls == 1
    assert result.stats.main_calls < result.stats.new_tokens  # drafts were accepted
    hist = result.stats.accepted_hist
    assert sum(hist.values()) >= result.stats.rounds and all(k >= 0 for k in hist)


def test_lean_draft_forward_matches_the_model(setup):
    """The lean draft forward (fused q/k/v, cross-attention computed once) computes the assistant's own
    logits; with int8 weights it stays close enough to propose the same tokens almost always."""
    from transformers import WhisperForCausalLM

    from pipelines.engine.decoders import WhisperDraftDecoder, int8_available

    enc = setup[1].select(torch.tensor([0, 1]))
    model = WhisperForCausalLM.from_pretrained(embedded_path("whisper-base-decoder-2l"), dtype=torch.float32).eval()
    chunks = [PROMPT + [440, 1029, 318], PROMPT + [50257]]
    outs = {}
    with torch.inference_mode():
        for name, dec in (("hf", as_decoder(model)), ("lean", as_decoder(model, assistant=True)),
                          ("int8", as_decoder(model, assistant=True, int8=True))):
            cache = dec.new_cache(2)
            first, real = dec.forward(chunks, cache, enc, EOT)
            cache.commit(real)
            nxt, _ = dec.forward([[262], [262, 11]], cache, enc, EOT)  # ragged second chunk
            outs[name] = torch.cat([first, nxt], dim=1)
    assert isinstance(as_decoder(model, assistant=True), WhisperDraftDecoder)
    assert torch.allclose(outs["lean"], outs["hf"], atol=1e-4, rtol=1e-4)
    if int8_available():
        same = (outs["int8"].argmax(-1) == outs["hf"].argmax(-1)).float().mean().item()
        assert same >= 0.8
        assert not torch.equal(outs["int8"], outs["hf"])  # the int8 path really ran


def test_draft_distribution_over_a_reduced_vocabulary_is_full_size(setup):
    """Sampling with a reduced draft head: q is a distribution over the whole vocabulary, zero outside it."""
    from transformers import WhisperForCausalLM

    from pipelines.engine.drafters import ModelDrafter
    from pipelines.engine.rules import Sampling

    if not _distilled_shipped():
        pytest.skip("the distilled assistant is not shipped")
    model = WhisperForCausalLM.from_pretrained(embedded_path("whisper-base-distilled"), dtype=torch.float32).eval()
    dec = as_decoder(model, assistant=True)
    drafter = ModelDrafter(dec, setup[3], MAX_NEW, True, EOT)
    logits = torch.randn(len(dec.vocab_ids))
    tok, q, p_tok = drafter._choose(logits, Sampling(temperature=0.8), torch.Generator().manual_seed(0), True)
    assert q.shape == (model.config.vocab_size,) and abs(float(q.sum()) - 1.0) < 1e-5
    outside = torch.ones(model.config.vocab_size, dtype=torch.bool)
    outside[list(dec.vocab_ids)] = False
    assert float(q[outside].sum()) == 0.0 and tok in set(dec.vocab_ids) and q[tok] == p_tok


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_whisper_forward_is_bit_equal_to_transformers(setup, dtype):
    """Tandem's Whisper forward (its own loop over the model's modules) gives exactly transformers' logits,
    over ragged chunks (prompts of two lengths, drafts, an empty row), in float32 and bfloat16 (bfloat16:
    the path taken where the kernels are not row-stable; see the row-stable tests below)."""
    from transformers import DynamicCache, EncoderDecoderCache, WhisperForConditionalGeneration

    from pipelines.engine.decoders import RaggedCache, additive_mask

    model = WhisperForConditionalGeneration.from_pretrained(embedded_path("whisper-base"), dtype=dtype).eval()
    ours = as_decoder(model)
    ours.row_stable = False
    enc = setup[1].select(torch.tensor([0, 1]))
    enc = type(enc)(enc.hidden.to(dtype), None)

    def transformers_forward(chunks, cache):
        ids, positions, real, allowed = cache.plan(chunks, EOT, ours.max_positions)
        out = ours.decoder(input_ids=ids, attention_mask=additive_mask(allowed, dtype), encoder_hidden_states=enc.hidden,
                           cache=cache.cache, position_ids=positions, use_cache=True)
        return model.proj_out(out.last_hidden_state).float(), real

    steps = [[PROMPT, PROMPT[:3]], [[440, 1029], [50363]], [[318], [440, 11, 262]], [[11], []], [[262, 318, 440, EOT], [1029]]]
    theirs_cache = RaggedCache(EncoderDecoderCache(DynamicCache(), DynamicCache()), 2, ours.device)
    our_cache = ours.new_cache(2)
    with torch.inference_mode():
        for chunks in steps:
            want, real = transformers_forward(chunks, theirs_cache)
            theirs_cache.commit(real)
            got, real = ours.forward(chunks, our_cache, enc, EOT)
            our_cache.commit(real)
            assert torch.equal(got, want)


@pytest.fixture(scope="module")
def bf16_base():
    from transformers import WhisperForConditionalGeneration

    from pipelines.engine.decoders import row_stable_kernels

    if not row_stable_kernels(torch.bfloat16):
        pytest.skip("this machine's bfloat16 matrix kernels round a row differently with different row counts")
    model = WhisperForConditionalGeneration.from_pretrained(embedded_path("whisper-base"), dtype=torch.bfloat16).eval()
    decoder = as_decoder(model)
    assert decoder.row_stable and decoder.compact_at == 0.0
    return model, decoder


@torch.inference_mode()
def _greedy_tokens(decoder, enc, prompt, n):
    """n greedy tokens, one-token steps (the reference)."""
    cache, seq, out = decoder.new_cache(1), list(prompt), []
    chunk = seq
    for _ in range(n):
        logits, real = decoder.forward([chunk], cache, enc, EOT)
        cache.commit(real)
        chunk = [int(logits[0, -1].argmax())]
        out.append(chunk[0])
    return out


def test_bf16_verify_pass_is_bit_equal_to_one_token_steps(setup, bf16_base):
    """bfloat16, row-stable forward: logits for 40 tokens of a real clip fed one at a time, or three at a
    time (a verify pass), or three at a time with a rejected draft left as a hole and compacted, are the
    same bits; and they stay close to transformers' own bfloat16 forward."""
    from pipelines.engine.decoders import EncoderOutput

    model, decoder = bf16_base
    enc = EncoderOutput(setup[1].hidden[:1].to(torch.bfloat16), None)
    tokens = _greedy_tokens(decoder, enc, PROMPT, 40)

    def logits_in_chunks(size, hole=False):
        cache = decoder.new_cache(1)
        got, real = decoder.forward([PROMPT], cache, enc, EOT)
        cache.commit(real)
        rows = [got[0, -1]]
        for i in range(0, len(tokens) - 1, size):
            chunk = tokens[i:i + size]
            if hole:  # a wrong draft after the chunk, rejected: a hole in the cache, then compaction
                got, real = decoder.forward([chunk + [EOT]], cache, enc, EOT)
                cache.commit(real)
                cache.rollback(0, 1)
                cache.maybe_compact(decoder.compact_at)
                assert bool(cache.valid.all())
                got = got[:, :-1]
            else:
                got, real = decoder.forward([chunk], cache, enc, EOT)
                cache.commit(real)
            rows += [got[0, j] for j in range(len(chunk))]
        return torch.stack(rows[: len(tokens)])

    with torch.inference_mode():
        one = logits_in_chunks(1)
        assert torch.equal(one, logits_in_chunks(3)) and torch.equal(one, logits_in_chunks(3, hole=True))
        ids = torch.tensor([PROMPT + tokens[:-1]])
        theirs = model(encoder_outputs=(enc.hidden,), decoder_input_ids=ids).logits[0, len(PROMPT) - 1:].float()
    print("argmax agreement", (theirs.argmax(-1) == one.argmax(-1)).float().mean().item(),
          "mean abs diff", float((theirs - one).abs().mean()), "max", float((theirs - one).abs().max()))
    assert (theirs.argmax(-1) == one.argmax(-1)).float().mean() >= 0.95
    assert float((theirs - one).abs().mean()) < 0.25


def test_bf16_assisted_output_equals_plain(registry, bf16_base, speech_real):
    """bfloat16 end to end through the ASR pipeline: with the distilled assistant, one file at a time and
    four at a time, every transcript's tokens equal plain decoding's."""
    if not _distilled_shipped():
        pytest.skip("the distilled assistant is not shipped")
    from pipelines.asr import TranscribeOptions, WhisperRunner, transcribe

    pair = registry.get("whisper-base+distilled")
    runner = WhisperRunner(pair, "bfloat16")
    paths = [i["audio_path"] for i in speech_real]
    for batch in (1, 4):
        results = list(transcribe(paths, pair, TranscribeOptions(dtype="bfloat16", compare=True, batch_size=batch), runner))
        assert all(r.identical for r in results), [r.path for r in results if not r.identical]
        assert sum(r.accepted for r in results) > 0
