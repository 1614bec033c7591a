"""Exactness on real weights: the engine's output equals Whisper base's own greedy ``generate``, token for
token, over the real speech set, for every drafter, policy and batch size."""

from collections import Counter
from contextlib import contextmanager

import pytest
import torch
from whisper_base import EOT, PROMPT, assistant_name, causal_lm, distilled_shipped, features, strip_eot, whisper_base

from pipelines.devices import half_is_native
from pipelines.engine import (
    AssistedDecoder,
    DecodeOptions,
    PolicyOptions,
    as_decoder,
    model_drafter,
    rules_from_generation_config,
)
from pipelines.engine.whisper import CUDA_SHAPE, STEP_SHAPES

MAX_NEW = 440


@pytest.fixture(scope="module")
def setup(speech_real):
    main = whisper_base()
    x = features([i["audio_path"] for i in speech_real])
    with torch.inference_mode():
        refs = [main.generate(x[i : i + 1], language="en", task="transcribe", do_sample=False, num_beams=1,
                              max_new_tokens=MAX_NEW)[0].tolist() for i in range(len(x))]
    decoder = as_decoder(main)
    enc = decoder.encode(input_features=x)  # once: every configuration below reuses it
    rules = rules_from_generation_config(main.generation_config, len(PROMPT), MAX_NEW)
    drafters = {
        "none": None,
        "own-decoder": model_drafter(as_decoder(causal_lm("whisper-base-decoder")), share_encoder=True, pad_id=EOT),
        "truncated-2l": model_drafter(as_decoder(causal_lm("whisper-base-decoder-2l")), share_encoder=True, pad_id=EOT),
    }
    if distilled_shipped():
        distilled = causal_lm("whisper-base-distilled")
        drafters["distilled"] = model_drafter(as_decoder(distilled), share_encoder=True, pad_id=EOT)
        # the way pairs load it: the lean draft forward, with and without int8 weights
        drafters["distilled-lean"] = model_drafter(as_decoder(distilled, assistant=True), share_encoder=True, pad_id=EOT)
        drafters["distilled-int8"] = model_drafter(as_decoder(distilled, assistant=True, int8=True), share_encoder=True, pad_id=EOT)
    return decoder, enc, refs, rules, drafters


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


# Six configurations in CI cover each drafter and policy kind; the other seven run with -m slow (nightly).
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "drafter, policy, batch",
    [
        ("none", PolicyOptions("constant", 1), 1),
        pytest.param("none", PolicyOptions("constant", 1), 5, marks=SLOW),
        ("own-decoder", PolicyOptions("constant", 5), 1),
        pytest.param("own-decoder", PolicyOptions("constant", 8), 4, marks=SLOW),
        ("own-decoder", PolicyOptions("heuristic", 2), 12),
        pytest.param("truncated-2l", PolicyOptions("constant", 1), 1, marks=SLOW),
        ("truncated-2l", PolicyOptions("confidence", 4, 6, 0.4), 3),
        pytest.param("truncated-2l", PolicyOptions("adaptive", 3), 4, marks=SLOW),
        ("distilled", PolicyOptions("constant", 5), 1),
        pytest.param("distilled", PolicyOptions("adaptive"), 6, marks=SLOW),
        pytest.param("distilled-lean", PolicyOptions("constant", 2), 1, marks=SLOW),
        pytest.param("distilled-int8", PolicyOptions("constant", 3), 5, marks=SLOW),
        ("distilled-int8", PolicyOptions("adaptive", 2), 1),
    ],
)
def test_identical_to_whisper_generate(setup, drafter, policy, batch):
    refs = setup[2]
    if drafter not in setup[4]:
        pytest.skip("the distilled assistant is not shipped")
    outs, stats = _run(setup, drafter, policy, batch)
    assert [strip_eot(o) for o in outs] == refs
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


HOST_READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__")


@contextmanager
def _count_host_reads():
    """Counts the calls that read a tensor's values into Python (on a GPU each waits for the device)."""
    counts: Counter = Counter()
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counting(name, original):
        def read(self, *args, **kwargs):
            counts[name] += 1
            return original(self, *args, **kwargs)
        return read

    for name, original in saved.items():
        setattr(torch.Tensor, name, counting(name, original))
    try:
        yield counts
    finally:
        for name, original in saved.items():
            setattr(torch.Tensor, name, original)


@pytest.mark.parametrize("rows", [1, 4])
def test_two_host_reads_a_round_whatever_the_rows_and_lookahead(setup, rows, monkeypatch):
    """With an accelerator's strategies (``rows.indexed``: on a CPU reads cost nothing, so there the engine
    also reads the argmax before the log-probabilities and checks each draft step for rows left), greedy
    rounds read the device twice, however many rows and drafts: the drafts once (the drafter feeds its argmax
    back on the device), the verify pass's argmax and log-probabilities once. Outputs unchanged."""
    from pipelines.engine import rows as row_copies

    decoder, enc, refs, rules, drafters = setup
    if "distilled-lean" not in drafters:
        pytest.skip("the distilled assistant is not shipped")
    monkeypatch.setattr(row_copies, "indexed", lambda device: True)
    engine = AssistedDecoder(decoder, drafters["distilled-lean"], pad_id=EOT)
    for k in (2, 5):
        options = DecodeOptions(max_new_tokens=MAX_NEW, policy=PolicyOptions("constant", k))
        with _count_host_reads() as counts:
            result = engine.generate([PROMPT] * rows, rules, options, encoder_output=enc.select(torch.arange(rows)))
        assert [strip_eot(list(t)) for t in result.tokens] == refs[:rows]
        assert result.stats.draft_calls > result.stats.rounds  # several draft steps a round
        assert sum(counts.values()) <= 2 * result.stats.rounds, dict(counts)


def test_device_drafting_proposes_the_host_loops_drafts(setup):
    """The drafter's device-side greedy loop and its host loop (taken where rules need each prefix) propose
    the same tokens: the same acceptance in every round, and on a CPU the same draft passes (the device loop
    ends when every row has stopped, here by the confidence threshold or end of sequence)."""
    decoder, enc, refs, rules, drafters = setup
    if "distilled-lean" not in drafters:
        pytest.skip("the distilled assistant is not shipped")
    lean = as_decoder(causal_lm("whisper-base-distilled"), assistant=True)
    for policy in (PolicyOptions("confidence"), PolicyOptions("random", seed=3)):  # stops by probability; ragged ks, some 0
        hists = []
        for device_steps in (True, False):
            lean.device_steps = device_steps
            engine = AssistedDecoder(decoder, model_drafter(lean, share_encoder=True, pad_id=EOT), pad_id=EOT)
            options = DecodeOptions(max_new_tokens=MAX_NEW, policy=policy)
            result = engine.generate([PROMPT] * 3, rules, options, encoder_output=enc.select(torch.arange(3)))
            assert [strip_eot(list(t)) for t in result.tokens] == refs[:3]
            s = result.stats
            hists.append((s.drafted, s.accepted, s.accepted_hist, s.rounds, s.draft_calls, result.sum_logprobs))
        assert hists[0] == hists[1], policy


def test_static_writes_and_pooled_caches_keep_outputs_exact(setup):
    """The CUDA-graph path's buffers and writes, run eagerly on the CPU (``graphs = "eager"``): every column
    writes a slot (padding the scratch one), caches are lent by a pool and lent again to the next request
    (new cross-attention keys and values copied in). Plain and assisted equal Whisper's generate, batch 1
    and 4, and a request of each shape gets back the cache the last one gave back."""
    from pipelines.engine.whisper import WhisperDecoder

    decoder, enc, refs, rules, drafters = setup
    static = WhisperDecoder(decoder.model)
    static.graphs = "eager"
    drafter = drafters.get("distilled-lean", drafters["truncated-2l"])
    logprobs = {}
    for make in (None, drafter):
        engine = AssistedDecoder(static, make, pad_id=EOT)
        options = DecodeOptions(max_new_tokens=MAX_NEW, policy=PolicyOptions("constant", 3))
        for rows in ([0], [1], [0, 1, 2, 3]):
            result = engine.generate([PROMPT] * len(rows), rules, options, encoder_output=enc.select(torch.tensor(rows)))
            assert [strip_eot(list(t)) for t in result.tokens] == [refs[r] for r in rows]
            logprobs.setdefault(make is None, []).append(result.sum_logprobs)
    # past the first round (its prompt goes through a prompt pass) the pass's own graph applies the suppressed
    # ids and chooses (fixed.FixedShapeDecoder.fused_choice): the same log-probabilities, to the bit; no
    # position there is a first token, so the graph holds no length rule
    assert logprobs[True] == logprobs[False]
    pooled = static._graph_pool.free
    assert all(list(c[0].choices) == [(rules.suppress, False, None)] for c in pooled.values())
    assert sorted(pooled) == sorted({(1, 448, static.shape.width_for(1)), (4, 448, static.shape.width_for(4))})
    assert all(len(caches) == 1 for caches in pooled.values())  # each lent again, never two of one shape
    cache = pooled[(1, 448, static.shape.width_for(1))][0]
    assert cache.slot_count == 449 and cache.graph is not None and cache.graph.graph is None  # eager: nothing captured
    assert cache.cross_graph is not None  # the cross-attention keys and values: a graph of their own, every request


def test_the_choice_graph_reads_each_row_from_its_pending_token(setup):
    """The first round with the no-speech check's logits (``logits_at``: the prompt and the drafts through one
    full-width pass, each row's first verified column its prompt's last) is chosen by the pass's choice graph
    too, each row read from that column on, with the rules of a first token applied on the device (Whisper's
    first-token suppressions, from each position's generated length; and with its timestamp rules, the
    first timestamp's): outputs equal the ragged path's, and log-probabilities the same passes' chosen on the
    host, to the bit, batch 1 and 4, with and without those suppressions and timestamps (a graph reading from column 0 chose the token after
    <|startoftranscript|>)."""
    import dataclasses

    from pipelines.engine.timestamps import TimestampRules
    from pipelines.engine.whisper import WhisperDecoder

    decoder, enc, _, rules, _ = setup
    gen = decoder.model.generation_config
    stamps = TimestampRules.from_generation_config(gen, 3)
    options = DecodeOptions(max_new_tokens=MAX_NEW, policy=PolicyOptions("constant", 3), logits_at=0)
    for case, prompt in ((rules, PROMPT), (dataclasses.replace(rules, begin_suppress=()), PROMPT),
                         (dataclasses.replace(rules, timestamps=stamps), PROMPT[:3])):
        static = WhisperDecoder(decoder.model, width=CUDA_SHAPE.width)
        static.graphs = "eager"
        offsets = []
        choose = static.fused_choice

        def recorded(cache, logits, rules, offs, states, choose=choose, offsets=offsets):
            made = choose(cache, logits, rules, offs, states)
            offsets.append(made is not None and max(offs))
            return made

        static.fused_choice = recorded
        host = WhisperDecoder(decoder.model, width=CUDA_SHAPE.width)  # the same passes, the rules and choice eager
        host.graphs = "eager"
        host.fused_choice = lambda *args: None
        for rows in ([0], [0, 1, 2, 3]):
            window, batch = enc.select(torch.tensor(rows)), [prompt] * len(rows)
            want = AssistedDecoder(decoder, None, pad_id=EOT).generate(batch, case, options, encoder_output=window)
            eager = AssistedDecoder(host, None, pad_id=EOT).generate(batch, case, options, encoder_output=window)
            got = AssistedDecoder(static, None, pad_id=EOT).generate(batch, case, options, encoder_output=window)
            assert got.tokens == want.tokens == eager.tokens, (case, rows)
            assert got.sum_logprobs == eager.sum_logprobs and torch.equal(got.prompt_logits, eager.prompt_logits)
        assert offsets.count(len(prompt) - 1) == 2, offsets  # each request's first round chosen by the graph
        if case.begin_suppress:  # a graph with the first token's rules, another without
            keys = {k[1] for c in static._graph_pool.free.values() for k in c[0].choices}
            assert keys == {False, (case.begin_suppress, case.min_new_tokens, case.eos)}, keys


def test_static_draft_cache_drafts_as_the_ragged_one(setup):
    """The drafters' CUDA-graph path run eagerly on the CPU: the lean assistant over a pooled static cache
    (``draft_cache.StaticDraftCache``: rollbacks step positions back, steps and the draft loop's epilogue
    through the fused graphs' buffers) beside the fixed-shape main decoder's static path. Outputs equal generate's, batch 1 and 4;
    the drafts equal the ragged cache's round by round on these clips (the same model, attention over
    another length, and a round's first feed padded to a graph's width: equal to float32 rounding); each
    cache is lent again."""
    from pipelines.engine.whisper import WhisperDecoder

    decoder, enc, refs, rules, drafters = setup
    model = causal_lm(assistant_name())
    main = WhisperDecoder(decoder.model)
    main.graphs = "eager"
    options = DecodeOptions(max_new_tokens=MAX_NEW, policy=PolicyOptions("constant", 4))
    stats, lean = {}, None
    for kind in ("ragged", "static"):
        lean = as_decoder(model, assistant=True)
        lean.graphs = "eager" if kind == "static" else None
        engine = AssistedDecoder(main, model_drafter(lean, share_encoder=True, pad_id=EOT), pad_id=EOT)
        for rows in ([0], [1], [0, 1, 2, 3], [4, 5, 6, 7]):
            result = engine.generate([PROMPT] * len(rows), rules, options, encoder_output=enc.select(torch.tensor(rows)))
            assert [strip_eot(list(t)) for t in result.tokens] == [refs[r] for r in rows], (kind, rows)
            stats.setdefault(kind, []).append((result.stats.drafted, result.stats.accepted, result.stats.rounds))
    assert stats["static"] == stats["ragged"]
    assert all(0 < a < d for d, a, _ in stats["static"])
    pooled = lean._graph_pool.free
    assert sorted(k[0] for k in pooled) == [1, 4] and all(len(c) == 1 for c in pooled.values())
    # the draft loop's steps with their epilogue (draft_loop.py): a one-token step reading the loop's own
    # buffers, and a round's first feed (1 to 5 tokens a row at lookahead 4) padded to 1, 2, 4 or 8 columns;
    # each kept with the cache (captured on CUDA); nothing captured here
    fused = [k[:2] for c in pooled.values() for k in c[0].fused]
    assert ("step", 1) in fused and {w for kind, w in fused if kind == "feed"} >= {1, 2}, fused
    assert all(g.graph is None for c in pooled.values() for g in c[0].fused.values())
    assert all(c[0].cross_graph is not None for c in pooled.values())  # and the first feed replays: cross set before
    assert all(w in (1, 2, 4, 8) for _, w in fused)


def test_timestamp_rules_in_the_device_draft_loop(setup, windows):
    """With Whisper's timestamp rules the greedy draft loop stays on the device: it keeps each row's timestamp
    state and moves it on token by token (``timestamps.py``), inside the fused steps of a static cache. Its
    drafts equal the host loop's (every rule from the host prefixes) round by round on three clips and a dense
    30 s window with a previous-text prompt, ragged and static caches; outputs equal plain decoding's and hold
    timestamps. Fails where the loop drafts without the rules or moves the state on wrongly."""
    from dataclasses import replace

    from pipelines.engine.timestamps import TimestampRules
    from pipelines.engine.whisper import WhisperDecoder

    decoder, _, _, _, _ = setup
    model = causal_lm(assistant_name())
    x, prompts = windows
    gen = decoder.model.generation_config
    with torch.inference_mode():
        enc = decoder.encode(input_features=x)
    options = DecodeOptions(max_new_tokens=MAX_NEW, policy=PolicyOptions("constant", 4))
    for prompt, rows in ((PROMPT[:3], [0, 1, 2]), (prompts[3], [3])):
        stamps = TimestampRules.from_generation_config(gen, len(prompt))
        rules = replace(rules_from_generation_config(gen, len(prompt), MAX_NEW), timestamps=stamps)
        batch = [list(prompt)] * len(rows)
        window = enc.select(torch.tensor(rows))
        plain = [list(t) for t in AssistedDecoder(decoder, None, pad_id=EOT).generate(batch, rules, options, encoder_output=window).tokens]
        assert all(sum(t >= stamps.begin for t in row) >= 2 for row in plain)  # timestamped segments
        stats = {}
        for kind in ("host", "ragged", "static"):
            lean = as_decoder(model, assistant=True)
            lean.graphs = "eager" if kind == "static" else None
            lean.device_steps = kind != "host"
            engine = AssistedDecoder(decoder, model_drafter(lean, share_encoder=True, pad_id=EOT), pad_id=EOT)
            result = engine.generate(batch, rules, options, encoder_output=window)
            assert [list(t) for t in result.tokens] == plain, (kind, rows)
            stats[kind] = (result.stats.drafted, result.stats.accepted, result.stats.rounds)
            if kind == "static":
                cache = next(iter(lean._graph_pool.free.values()))[0]
                assert ("step", 1) in {k[:2] for k in cache.fused if k[-1] == replace(stamps, prompt_len=0)}
        assert stats["static"] == stats["ragged"] == stats["host"], (rows, stats)
        assert 0 < stats["host"][1] < stats["host"][0]
        # the main decoder's static path: past the first token its choice graph applies the timestamp rules
        # from the rows' states (fixed.FixedShapeDecoder.fused_choice); plain and assisted equal, to the bit
        static = WhisperDecoder(decoder.model)
        static.graphs = "eager"
        runs = [AssistedDecoder(static, d, pad_id=EOT).generate(batch, rules, options, encoder_output=window)
                for d in (None, model_drafter(lean, share_encoder=True, pad_id=EOT))]
        assert all([list(t) for t in r.tokens] == plain for r in runs)
        assert runs[0].sum_logprobs == runs[1].sum_logprobs
        key = (rules.suppress, False, replace(stamps, prompt_len=0))  # (the prompt's length: read on the host only)
        assert all(list(c[0].choices) == [key] for c in static._graph_pool.free.values())


def test_a_draft_in_the_models_half_precision_off_the_cpu(setup):
    """Off a CPU the lean assistant computes in its model's dtype (bfloat16 on CUDA), its static cache too;
    run here through the CUDA path's buffers (``graphs = "eager"``) with that dtype forced: outputs equal
    generate's (verification decides them), the drafts are still mostly accepted, and on a CPU the default
    stays float32 (and int8 forces it)."""
    from pipelines.engine.whisper import WhisperDecoder, WhisperDraftDecoder

    decoder, enc, refs, rules, drafters = setup
    model = causal_lm(assistant_name(), torch.bfloat16)
    assert WhisperDraftDecoder(model).dtype == torch.float32  # a CPU: float32 activations by default
    lean = WhisperDraftDecoder(model, dtype=torch.bfloat16)
    lean.graphs = "eager"
    assert lean.head.weight.dtype == torch.bfloat16 and lean.layers[0]["qkv"].weight.dtype == torch.bfloat16
    main = WhisperDecoder(decoder.model)
    main.graphs = "eager"
    engine = AssistedDecoder(main, model_drafter(lean, share_encoder=True, pad_id=EOT), pad_id=EOT)
    options = DecodeOptions(max_new_tokens=MAX_NEW, policy=PolicyOptions("constant", 4))
    for rows in ([0], [0, 1, 2, 3]):
        result = engine.generate([PROMPT] * len(rows), rules, options, encoder_output=enc.select(torch.tensor(rows)))
        assert [strip_eot(list(t)) for t in result.tokens] == [refs[r] for r in rows], rows
        assert result.stats.accepted > 0.4 * result.stats.drafted, result.stats
    cache = next(iter(lean._graph_pool.free.values()))[0]
    assert cache.cache.layers[0].keys.dtype == torch.bfloat16


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
    logits (as the model's own modules do, to float32 rounding); with int8 weights it stays close enough to propose the same tokens almost always."""
    from pipelines.engine.whisper import WhisperDraftDecoder, int8_available

    enc = setup[1].select(torch.tensor([0, 1]))
    model = causal_lm("whisper-base-decoder-2l")
    chunks = [PROMPT + [440, 1029, 318], PROMPT + [50257]]
    outs = {}
    with torch.inference_mode():
        for name, dec in (("hf", as_decoder(model)), ("lean", as_decoder(model, assistant=True)),
                          ("int8", as_decoder(model, assistant=True, int8=True))):
            cache = dec.new_cache(2)
            first, real = dec.forward(chunks, cache, enc, EOT)
            cache.commit(real)
            nxt, real2 = dec.forward([[262], [262, 11]], cache, enc, EOT)  # ragged second chunk
            outs[name] = torch.cat([first[real], nxt[real2]])  # the real tokens' logits (padding is anything)
    assert isinstance(as_decoder(model, assistant=True), WhisperDraftDecoder)
    assert torch.allclose(outs["lean"], outs["hf"], atol=2e-3, rtol=0), float((outs["lean"] - outs["hf"]).abs().max())
    assert torch.equal(outs["lean"].argmax(-1), outs["hf"].argmax(-1))
    if int8_available():
        same = (outs["int8"].argmax(-1) == outs["hf"].argmax(-1)).float().mean().item()
        assert same >= 0.8
        assert not torch.equal(outs["int8"], outs["hf"])  # the int8 path really ran


def test_draft_distribution_over_a_reduced_vocabulary_is_full_size(setup):
    """Sampling with a reduced draft head: q is a distribution over the whole vocabulary, zero outside it."""
    from pipelines.engine.drafters import ModelDrafter
    from pipelines.engine.rules import Sampling

    if not distilled_shipped():
        pytest.skip("the distilled assistant is not shipped")
    model = causal_lm("whisper-base-distilled")
    dec = as_decoder(model, assistant=True)
    drafter = ModelDrafter(dec, setup[3], MAX_NEW, True, EOT)
    logits = torch.randn(len(dec.vocab_ids))
    tok, q, p_tok = drafter._sample(logits, Sampling(temperature=0.8), torch.Generator().manual_seed(0))
    assert q.shape == (model.config.vocab_size,) and abs(float(q.sum()) - 1.0) < 1e-5
    outside = torch.ones(model.config.vocab_size, dtype=torch.bool)
    outside[list(dec.vocab_ids)] = False
    assert float(q[outside].sum()) == 0.0 and tok in set(dec.vocab_ids) and q[tok] == p_tok


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_whisper_forward_matches_transformers(setup, dtype):
    """Tandem's fixed-shape Whisper forward computes transformers' model: over ragged chunks (prompts of two
    lengths, drafts, an empty row) its logits are within rounding of transformers' own forward and give the
    same argmax."""
    model = whisper_base(dtype)
    ours = as_decoder(model)
    enc = setup[1].select(torch.tensor([0, 1]))
    enc = type(enc)(enc.hidden.to(dtype), None)
    steps = [[PROMPT, PROMPT[:3]], [[440, 1029], [50363]], [[318], [440, 11, 262, 1029, 318, 11]], [[11], []],
             [[262, 318, 440, EOT], [1029]]]
    seqs, got_rows, want_rows = [[], []], [], []
    cache = ours.new_cache(2)
    with torch.inference_mode():
        for chunks in steps:
            got, real = ours.forward(chunks, cache, enc, EOT)
            cache.commit(real)
            for b, chunk in enumerate(chunks):
                if not chunk:
                    continue
                seqs[b] += chunk
                want = model(encoder_outputs=(enc.hidden[b:b + 1],), decoder_input_ids=torch.tensor([seqs[b]])).logits
                got_rows.append(got[b, : len(chunk)])
                want_rows.append(want[0, -len(chunk):].float())
    got, want = torch.cat(got_rows), torch.cat(want_rows)
    same_argmax = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    if dtype == torch.float32:
        assert torch.allclose(got, want, atol=1e-3, rtol=0) and same_argmax == 1.0
    else:  # another order of bfloat16 roundings: close, not equal
        assert float((got - want).abs().mean()) < 0.25 and same_argmax >= 0.8  # bf16 ulp at 16 is 0.125


# --- exactness by construction: verify passes give every token the bits of a plain step ----------------


def _dtypes():
    """Every dtype this machine computes Whisper in (CPU: float32, bfloat16, float16)."""
    return [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def windows(speech_real):
    """Encoder inputs for exactness checks: three real clips, and one dense 30 s window of long-form speech
    (real clips played one after the other) decoded with timestamps and a previous-text prompt."""
    import numpy as np

    from pipelines.audio import load_audio

    clips = [load_audio(i["audio_path"]) for i in speech_real]
    x = features(clips[:3] + [np.concatenate(clips)[: 30 * 16000]])
    previous = [50361, 440, 1029, 318, 257, 1332, 295, 264, 1391, 13]  # <|startofprev|> + earlier text
    prompts = [PROMPT, PROMPT, PROMPT, previous + PROMPT[:3]]  # the long window with timestamps
    return x, prompts


@pytest.fixture(scope="module", params=_dtypes(), ids=lambda d: str(d).split(".")[-1])
def exact_decoder(request, windows):
    dtype = request.param
    model = whisper_base(dtype)
    decoder = as_decoder(model)
    with torch.inference_mode():
        enc = decoder.encode(input_features=windows[0])
    return decoder, enc


@torch.inference_mode()
def _plain_run(decoder, enc, prompts, n):
    """One-token steps for all rows at once (finished rows fed nothing): per row the greedy tokens and the
    logits each was chosen from."""
    cache = decoder.new_cache(len(prompts))
    chunks, tokens, logits = [list(p) for p in prompts], [[] for _ in prompts], [[] for _ in prompts]
    while any(chunks):
        out, real = decoder.forward(chunks, cache, enc, EOT, need_from=[len(c) - 1 for c in chunks])
        cache.commit(real)
        for b, chunk in enumerate(chunks):
            if not chunk:
                continue
            row = out[b, len(chunk) - 1]
            logits[b].append(row)
            tokens[b].append(int(row.argmax()))
            chunks[b] = [] if tokens[b][-1] == EOT or len(tokens[b]) >= n else [tokens[b][-1]]
    return tokens, logits


@torch.inference_mode()
def _scheduled_run(decoder, enc, prompts, tokens, logits, rng):
    """Assisted decoding with a random schedule: each round a row drafts 0 to 8 of its true next tokens, each
    replaced by a wrong one with probability 1/4 (a rejected draft whose slot is written again later). Every
    logits row that verification reads must have the bits of the plain run's; returns the rounds taken."""
    cache = decoder.new_cache(len(prompts))
    pending, done = [list(p) for p in prompts], [0] * len(prompts)
    rounds = 0
    while any(pending):
        drafts = []
        for b in range(len(prompts)):
            k = rng.randint(0, 8) if pending[b] else 0
            truth = tokens[b][done[b]: done[b] + k]
            drafts.append([t if rng.random() >= 0.25 else (t + 1) % 50000 for t in truth])
        chunks = [p + d for p, d in zip(pending, drafts)]
        out, _ = decoder.forward(chunks, cache, enc, EOT, need_from=[len(p) - 1 for p in pending])
        rounds += 1
        keep = torch.zeros(len(prompts), max(1, max(map(len, chunks))), dtype=torch.bool)
        for b, (p, d) in enumerate(zip(pending, drafts)):
            if not p:
                continue
            n = 0
            while n < len(d) and d[n] == tokens[b][done[b] + n]:
                n += 1
            n_out = min(n + 1, len(tokens[b]) - done[b])  # accepted drafts + the main model's token, to the end
            for j in range(n_out):
                assert torch.equal(out[b, len(p) - 1 + j], logits[b][done[b] + j]), (b, done[b] + j)
            keep[b, : len(p) + n] = True
            done[b] += n_out
            pending[b] = [] if done[b] >= len(tokens[b]) else [tokens[b][done[b] - 1]]
        cache.commit(keep)
    return rounds


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), 2])
def test_verify_passes_have_the_bits_of_plain_steps(exact_decoder, windows, seed):
    """The exactness property on the real model, in every dtype: random lookahead schedules (0 to 8 drafts
    per row and round, wrong drafts included, rows of one batch at different positions and finishing at
    different times) over real clips and a dense long-form window with a previous-text prompt give every
    token the same logits bits as plain one-token steps, hence the same greedy tokens."""
    import random

    decoder, enc = exact_decoder
    dtype = str(decoder.dtype).removeprefix("torch.")
    if seed and not half_is_native(str(enc.hidden.device), dtype):
        pytest.skip(f"{dtype} is emulated on this CPU (devices.half_is_native), several times slower than float32: "
                    "checked with one seed")
    prompts = windows[1]
    tokens, logits = _plain_run(decoder, enc, prompts, 64)
    assert len(tokens[3]) >= 40  # the long window is dense speech
    rounds = _scheduled_run(decoder, enc, prompts, tokens, logits, random.Random(seed))
    assert rounds < max(map(len, tokens))  # drafts were accepted: fewer rounds than tokens


def test_one_row_alone_and_in_a_batch_are_each_exact(exact_decoder, windows):
    """Batch 1 (a file decoded alone) has its own shapes; plain and assisted still agree bit for bit."""
    import random

    decoder, enc = exact_decoder
    one = type(enc)(enc.hidden[3:4], None)
    tokens, logits = _plain_run(decoder, one, windows[1][3:4], 48)
    _scheduled_run(decoder, one, windows[1][3:4], tokens, logits, random.Random(7))


def _table_shapes() -> list[tuple[int, bool]]:
    """Every (width, head form) the table can give, on any machine kind and at any batch size."""
    shapes = {(4, False), (CUDA_SHAPE.width, CUDA_SHAPE.head_transposed)} | {(s.width, s.head_transposed) for s in STEP_SHAPES.values()}
    return sorted(shapes | {(s.batch_width, s.head_transposed) for s in STEP_SHAPES.values() if s.batch_width})


@pytest.mark.parametrize("width, transposed", _table_shapes())
def test_every_pass_shape_of_the_table_is_exact(windows, width, transposed):
    """Each machine takes its own pass shape (``step_shape``); every shape of the table holds the property,
    whatever machine runs this (float32, the long window alone, a random schedule)."""
    import random

    model = whisper_base()
    decoder = as_decoder(model)
    decoder.width, decoder.head_transposed = width, transposed
    with torch.inference_mode():
        one = decoder.encode(input_features=windows[0][3:4])
    tokens, logits = _plain_run(decoder, one, windows[1][3:4], 32)
    _scheduled_run(decoder, one, windows[1][3:4], tokens, logits, random.Random(11))


@pytest.mark.parametrize("dtype, lookahead", [
    ("bfloat16", "random:3"), ("float32", "random:4"),
    pytest.param("bfloat16", "adaptive", marks=pytest.mark.slow), pytest.param("float16", "constant:8", marks=pytest.mark.slow),
])
def test_assisted_transcripts_equal_plain(registry, speech_real, dtype, lookahead):
    """End to end through the ASR pipeline with the distilled assistant, four files at a time (all twelve) and
    one at a time (the first four: the engine-level checks above cover the schedules in depth; CI time):
    every transcript's tokens equal plain decoding's, whatever the lookahead schedule."""
    if not distilled_shipped():
        pytest.skip("the distilled assistant is not shipped")
    from pipelines.asr import TranscribeOptions, WhisperRunner, transcribe
    from pipelines.engine import parse_policy

    pair = registry.get("whisper-base+distilled")
    runner = WhisperRunner(pair, dtype)
    paths = [i["audio_path"] for i in speech_real]
    for batch, files in ((4, paths), (1, paths[:4])):
        options = TranscribeOptions(dtype=dtype, compare=True, batch_size=batch, policy=parse_policy(lookahead))
        results = list(transcribe(files, pair, options, runner))
        assert all(r.identical for r in results), [r.path for r in results if not r.identical]
        assert sum(r.accepted for r in results) > 0
