"""Continuous batching on real weights: rows that join a running decode at its round boundaries, and rows left
after the empty slots are dropped, each give Whisper base's own greedy ``generate`` output, token for token."""

import pytest
import torch
from whisper_base import EOT, PROMPT, causal_lm, distilled_shipped, features, strip_eot, whisper_base

from pipelines.engine import AssistedDecoder, DecodeOptions, as_decoder, model_drafter, rules_from_generation_config
from pipelines.engine.continuous import ContinuousBatch, Joiner

MAX_NEW = 120


@pytest.fixture(scope="module")
def setup(speech_real):
    main = whisper_base()
    x = features([i["audio_path"] for i in speech_real[:7]])
    with torch.inference_mode():
        refs = [strip_eot(main.generate(x[i : i + 1], language="en", task="transcribe", do_sample=False, num_beams=1,
                                        max_new_tokens=MAX_NEW)[0].tolist()) for i in range(len(x))]
    decoder = as_decoder(main)
    enc = decoder.encode(input_features=x)
    rules = rules_from_generation_config(main.generation_config, len(PROMPT), MAX_NEW)
    name = "whisper-base-distilled" if distilled_shipped() else "whisper-base-decoder-2l"
    drafter = model_drafter(as_decoder(causal_lm(name), assistant=True), share_encoder=True, pad_id=EOT)
    return decoder, enc, refs, rules, drafter


def _joiner(enc, i: int) -> Joiner:
    return Joiner(i, tuple(PROMPT), enc.select(torch.tensor([i])))


def _drive(batch: ContinuousBatch, enc, waiting: list[int], join_every: int, compact_below: int | None = None,
           grow_to: int = 0, cancel: dict[int, int] | None = None):
    """Step the batch until every row is done, one waiting clip joining a free slot every ``join_every`` rounds
    (the batch grows by one slot where it has none free, up to ``grow_to`` slots); ``cancel``: clip -> the round
    its row is stopped at."""
    out, rounds = {}, 0
    while batch.live or waiting:
        if waiting and not batch.free and batch.slots < grow_to:
            batch.grow(1)
        if waiting and batch.free and rounds % join_every == 0:
            batch.join([_joiner(enc, waiting.pop(0))])
        for clip, at in (cancel or {}).items():
            if at == rounds:
                assert batch.cancel(clip)
        if compact_below is not None and not waiting and batch.live <= compact_below:
            batch.compact()
        for key, result in batch.step():
            out[key] = result
        rounds += 1
    return out


@pytest.mark.parametrize("assisted", [True, False])
def test_rows_joining_mid_call_equal_their_own_greedy_decode(setup, assisted):
    decoder, enc, refs, rules, drafter = setup
    engine = AssistedDecoder(decoder, drafter if assisted else None, pad_id=EOT)
    batch = ContinuousBatch(engine, rules, DecodeOptions(max_new_tokens=MAX_NEW), 3, [_joiner(enc, 0), _joiner(enc, 1)])
    out = _drive(batch, enc, list(range(2, len(refs))), join_every=3, compact_below=1)
    batch.close()
    assert sorted(out) == list(range(len(refs)))
    for i, ref in enumerate(refs):
        assert strip_eot(list(out[i].tokens[0])) == ref, f"clip {i}"
        assert out[i].stats.new_tokens == len(out[i].tokens[0]) and out[i].stats.row_calls > 0
    if assisted:  # the assistant drafted for every row, joined ones too (its row reset, not restarted), and was right
        assert all(r.stats.accepted > 0 for r in out.values()), {i: r.stats.accepted for i, r in out.items()}


def test_a_joining_row_gets_the_drafts_a_fresh_assistant_would_give_it(setup):
    decoder, enc, refs, rules, drafter = setup
    engine = AssistedDecoder(decoder, drafter, pad_id=EOT)
    batch = ContinuousBatch(engine, rules, DecodeOptions(max_new_tokens=MAX_NEW), 2, [_joiner(enc, 0), _joiner(enc, 1)])
    while batch.live == 2:  # clip 1 (the shorter) leaves; clip 3 takes its slot
        batch.step()
    row = next(b for b, r in enumerate(batch.rows) if r is None)
    own = batch.drafter
    batch.join([_joiner(enc, 3)])
    assert batch.drafter is own  # the row was reset in place
    fresh = drafter(rules, MAX_NEW)
    fresh.start([PROMPT], enc.select(torch.tensor([3])), None)
    seqs = [list(s) for s in batch.req.seqs]
    with torch.inference_mode():
        joined = own.draft([4 if b == row else 0 for b in range(2)], seqs, [0, 0], None, None, None).tokens[row]
        alone = fresh.draft([4], [list(PROMPT)], [0], None, None, None).tokens[0]
    assert joined == alone and len(alone) == 4
    batch.close()


def test_a_grown_batch_and_a_stopped_row_leave_the_other_rows_exact(setup):
    decoder, enc, refs, rules, drafter = setup
    engine = AssistedDecoder(decoder, drafter, pad_id=EOT)
    batch = ContinuousBatch(engine, rules, DecodeOptions(max_new_tokens=MAX_NEW), 1, [_joiner(enc, 0)])
    out = _drive(batch, enc, list(range(1, 5)), join_every=2, grow_to=3, cancel={1: 6})
    assert batch.slots == 3
    batch.close()
    assert sorted(out) == [0, 2, 3, 4]  # clip 1 was stopped
    for i in out:
        assert strip_eot(list(out[i].tokens[0])) == refs[i], f"clip {i}"


def test_joined_rows_report_their_own_no_speech_logits(setup):
    decoder, enc, refs, rules, drafter = setup
    engine = AssistedDecoder(decoder, drafter, pad_id=EOT)
    options = DecodeOptions(max_new_tokens=MAX_NEW, logits_at=0)
    alone = [engine.generate([PROMPT], rules, options, encoder_output=enc.select(torch.tensor([i]))) for i in (0, 2)]
    batch = ContinuousBatch(engine, rules, options, 2, [_joiner(enc, 0)])
    out = _drive(batch, enc, [2], join_every=2)
    for i, one in zip((0, 2), alone):
        assert out[i].tokens == one.tokens
        assert torch.allclose(out[i].prompt_logits, one.prompt_logits, atol=1e-4)


def test_refuses_what_it_cannot_keep_exact(setup):
    decoder, enc, refs, rules, drafter = setup
    engine = AssistedDecoder(decoder, drafter, pad_id=EOT)
    with pytest.raises(ValueError, match="greedily"):
        ContinuousBatch(engine, rules, DecodeOptions(do_sample=True), 2, [_joiner(enc, 0)])
    with pytest.raises(ValueError, match="greedily"):
        ContinuousBatch(engine, rules, DecodeOptions(compare_plain=True), 2, [_joiner(enc, 0)])
    batch = ContinuousBatch(engine, rules, DecodeOptions(max_new_tokens=MAX_NEW), 1, [_joiner(enc, 0)])
    with pytest.raises(ValueError, match="free slots"):
        batch.join([_joiner(enc, 1)])
    with pytest.raises(ValueError, match="encoder output"):
        ContinuousBatch(engine, rules, DecodeOptions(), 2, [Joiner(0, tuple(PROMPT))])
    batch.close()
