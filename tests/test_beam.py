"""Beam search through the engine (``engine/beam.py``, ``engine/beam_loop.py``) on the embedded Whisper base:
plain beam search equals transformers' ``generate(num_beams=N)`` token for token, and assisted beam search
equals plain beam search (whisper's and transformers' semantics, fixed and random lookahead schedules)."""

import pytest
import torch
from whisper_base import EOT, PROMPT, assistant_name, causal_lm, distilled_shipped, features, strip_eot, whisper_base

from pipelines.engine import (
    AssistedDecoder,
    DecodeOptions,
    PolicyOptions,
    as_decoder,
    model_drafter,
    rules_from_generation_config,
)
from pipelines.engine.beam import BeamOptions, WhisperBeams, rank_score
from pipelines.engine.beam_loop import beam_generate

MAX_NEW = 120
CLIPS = (1, 4, 10)  # three short speech-real recordings (3.0, 3.3 and 2.8 s)


@pytest.fixture(scope="module")
def setup(speech_real):
    main = whisper_base()
    x = features([speech_real[i]["audio_path"] for i in CLIPS])
    decoder = as_decoder(main)
    enc = decoder.encode(input_features=x)
    drafter = model_drafter(as_decoder(causal_lm(assistant_name()), assistant=distilled_shipped()),
                            share_encoder=True, pad_id=EOT)
    rules = rules_from_generation_config(main.generation_config, len(PROMPT), MAX_NEW)
    return main, x, AssistedDecoder(decoder, drafter, pad_id=EOT), enc, rules


def _beam(setup, clip, beam, use_drafter=False, policy=PolicyOptions("constant", 1), rules=None, prompt=PROMPT):
    _, _, engine, enc, default_rules = setup
    options = DecodeOptions(max_new_tokens=MAX_NEW, use_drafter=use_drafter, policy=policy)
    return beam_generate(engine, [prompt], rules or default_rules, options, beam,
                         encoder_output=enc.select(torch.tensor([clip])))


SLOW = pytest.mark.slow  # CI runs one clip and one schedule of each kind; -m slow the rest


@pytest.mark.parametrize("clip", [0, pytest.param(1, marks=SLOW), pytest.param(2, marks=SLOW)])
def test_plain_beam_equals_transformers_generate(setup, clip):
    main, x = setup[0], setup[1]
    with torch.inference_mode():
        ref = main.generate(x[clip : clip + 1], language="en", task="transcribe", num_beams=5,
                            max_new_tokens=MAX_NEW)[0].tolist()
    result = _beam(setup, clip, BeamOptions(5, style="transformers"))
    assert strip_eot(result.tokens[0]) == ref
    assert result.tokens[0][-1] == EOT
    assert result.stats.drafted == 0


@pytest.mark.parametrize("style, beam, policy", [
    ("whisper", 5, PolicyOptions("constant", 3)),
    pytest.param("whisper", 3, PolicyOptions("random", 0, 8, seed=1), marks=SLOW),
    pytest.param("transformers", 5, PolicyOptions("constant", 3), marks=SLOW),
    pytest.param("transformers", 2, PolicyOptions("random", 0, 8, seed=2), marks=SLOW),
])
def test_assisted_beam_equals_plain(setup, style, beam, policy):
    options = BeamOptions(beam, style=style)
    accepted = plain_calls = assisted_calls = 0
    for clip in range(len(CLIPS)):
        plain = _beam(setup, clip, options)
        assisted = _beam(setup, clip, options, use_drafter=True, policy=policy)
        assert assisted.tokens == plain.tokens
        assert assisted.sum_logprobs == plain.sum_logprobs  # the same steps on the same bits
        accepted += assisted.stats.accepted
        plain_calls += plain.stats.main_calls
        assisted_calls += assisted.stats.main_calls
    assert accepted > 0  # drafted steps were taken: the exact check ran on accepted drafts too
    assert assisted_calls < plain_calls


@pytest.mark.parametrize("policy", [PolicyOptions("heuristic", 2), PolicyOptions("confidence"), PolicyOptions()])
def test_assisted_beam_equals_plain_with_every_policy(setup, policy):
    """Every lookahead policy drives beam search (its first round cannot draft, and the policy is told of it:
    the heuristic one once failed there), and the output is plain beam search's."""
    options = BeamOptions(3)
    plain = _beam(setup, 0, options)
    assisted = _beam(setup, 0, options, use_drafter=True, policy=policy)
    assert assisted.tokens == plain.tokens and assisted.sum_logprobs == plain.sum_logprobs


def test_assisted_beam_with_timestamps_equals_plain(setup):
    from dataclasses import replace

    from pipelines.engine import TimestampRules

    main = setup[0]
    prompt = PROMPT[:-1]  # timestamps on
    rules = replace(rules_from_generation_config(main.generation_config, len(prompt), MAX_NEW),
                    timestamps=TimestampRules.from_generation_config(main.generation_config, len(prompt)))
    plain = _beam(setup, 0, BeamOptions(4), rules=rules, prompt=prompt)
    assisted = _beam(setup, 0, BeamOptions(4), True, PolicyOptions("constant", 4), rules=rules, prompt=prompt)
    assert assisted.tokens == plain.tokens
    assert any(t > EOT + 100 for t in plain.tokens[0])  # timestamp tokens were decoded


@SLOW
def test_compare_plain_reports_identical(setup):
    _, _, engine, enc, rules = setup
    options = DecodeOptions(max_new_tokens=MAX_NEW, policy=PolicyOptions("constant", 2), compare_plain=True)
    result = beam_generate(engine, [PROMPT, PROMPT], rules, options, BeamOptions(3), encoder_output=enc.select(torch.tensor([0, 2])))
    assert result.identical == (True, True) and result.plain_stats.drafted == 0
    assert [result.tokens[0], result.tokens[1]] == [_beam(setup, c, BeamOptions(3)).tokens[0] for c in (0, 2)]


class _OneInputWrong:
    """A drafter that drafts only end of text for input ``wrong``'s beams (a kept beam never ends in EOT, so
    that input can take no drafted step) and counts, per input, the drafts its beams took in drafted steps."""

    def __init__(self, inner, beam_size: int, wrong: int) -> None:
        self.inner, self.n, self.wrong = inner, beam_size, wrong
        self.taken = [0, 0]

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def draft(self, ks, *args):
        from dataclasses import replace

        d = self.inner.draft(ks, *args)
        return replace(d, tokens=[[EOT] * len(t) if r // self.n == self.wrong else t for r, t in enumerate(d.tokens)])

    def update(self, drafted, accepted, emitted):
        for r, a in enumerate(accepted):
            self.taken[r // self.n] += a
        self.inner.update(drafted, accepted, emitted)


def test_assisted_beam_drafts_per_input_in_a_batch(setup):
    """Two clips in one batch, input 1's drafts all wrong: input 0 still takes drafted steps (each input's
    beams are checked against their own drafts) and input 1 none, and both equal plain beam search of the batch
    score for score. Fails where a drafted step needs every beam of the batch to agree."""
    _, _, engine, enc, rules = setup
    made = []

    def make(rules, max_new):
        made.append(_OneInputWrong(engine.make_drafter(rules, max_new), 5, wrong=1))
        return made[-1]

    assisting = AssistedDecoder(engine.main, make, pad_id=EOT)
    batch = enc.select(torch.tensor([0, 1]))
    beam = BeamOptions(5)
    plain = beam_generate(engine, [PROMPT, PROMPT], rules, DecodeOptions(max_new_tokens=MAX_NEW, use_drafter=False),
                          beam, encoder_output=batch)
    options = DecodeOptions(max_new_tokens=MAX_NEW, policy=PolicyOptions("constant", 3))
    assisted = beam_generate(assisting, [PROMPT, PROMPT], rules, options, beam, encoder_output=batch)
    assert assisted.tokens == plain.tokens and assisted.sum_logprobs == plain.sum_logprobs
    assert made[0].taken[0] > 0 and made[0].taken[1] == 0
    assert assisted.stats.row_calls < plain.stats.row_calls  # input 0 stepped in fewer passes than plainly


def test_beam_refuses_sampling(setup):
    _, _, engine, enc, rules = setup
    with pytest.raises(ValueError, match="does not sample"):
        beam_generate(engine, [PROMPT], rules, DecodeOptions(do_sample=True), BeamOptions(2), encoder_output=enc)


def _logprobs(rows: list[dict[int, float]], vocab: int = 8) -> torch.Tensor:
    """(rows, vocab) log-probabilities: the given tokens' values, every other token far below."""
    lp = torch.full((len(rows), vocab), -50.0)
    for r, values in enumerate(rows):
        for t, v in values.items():
            lp[r, t] = v
    return lp


def test_whisper_bookkeeping_by_hand():
    eos = 7
    beams = WhisperBeams(BeamOptions(2, patience=1.5), groups=1, eos=(eos,))  # collects round(2 * 1.5) = 3
    # step 1: both rows hold the prompt, so their candidates are one sequence each (the later row's source)
    step = beams.step(_logprobs([{1: -0.1, 2: -0.5, 3: -2.0}] * 2), 0, 10)
    assert (step.sources, step.tokens) == ([1, 1], [1, 2])
    # step 2: (1, 7) ends first and is collected; the beams go on with the next two, whoever their source
    step = beams.step(_logprobs([{eos: -0.4, 4: -1.0, 5: -3.0}, {4: -0.2, 5: -0.3, 6: -4.0}]), 1, 10)
    assert beams.finished[0] == {(1, eos): pytest.approx(-0.5)}
    assert (step.sources, step.tokens) == ([1, 1], [4, 5]) and not beams.done
    # step 3: two more end (the third completes patience's 3), between them a beam that goes on
    beams.step(_logprobs([{eos: -0.1, 6: -0.2, 4: -5.0}, {eos: -0.15, 6: -9.0, 4: -9.5}]), 2, 10)
    assert set(beams.finished[0]) == {(1, eos), (2, 4, eos), (2, 5, eos)} and beams.done
    # the ranker: sum / length (tokens without EOS): (1) -0.5 / 1, (2, 4) -0.8 / 2, (2, 5) -0.95 / 2
    [(tokens, total)] = beams.finalize()
    assert tokens == (2, 4, eos) and total == pytest.approx(-0.8)
    # Google NMT's penalty with alpha 0: the plain sum, so the short one would win
    assert rank_score(-0.5, 1, 0.0) > rank_score(-0.8, 2, 0.0)
    assert rank_score(-0.8, 2, 1.0) == pytest.approx(-0.8 / (7 / 6))


def test_beam_options_check_ranges():
    with pytest.raises(ValueError, match="beam_size"):
        BeamOptions(0)
    with pytest.raises(ValueError, match="patience"):
        BeamOptions(2, patience=0)
    with pytest.raises(ValueError, match="length_penalty"):
        BeamOptions(2, length_penalty=1.5)
    assert BeamOptions(4, patience=2.0).max_candidates == 8


@pytest.mark.parametrize("fields, message", [
    ({"patience": 2.0}, "patience needs beam_size"),
    ({"beam_size": 3, "temperature": (0.2, 0.4)}, "temperature 0"),
    ({"best_of": 2, "temperature": (0.0,)}, "above 0"),
    ({"length_penalty": 0.5}, "needs beam_size or best_of"),
    ({"beam_size": 0}, "beam_size must be at least 1"),
    ({"beam_size": 2, "length_penalty": 2.0}, "from 0 to 1"),
    ({"beam_size": 100000}, "beam_size is 100000, at most 32"),  # (it once tried to allocate 307 GB)
    ({"best_of": 33}, "best_of is 33, at most 32"),
])
def test_transcribe_options_refuse_beam_combinations(fields, message):
    from pipelines.asr import TranscribeOptions

    with pytest.raises(ValueError, match=message):
        TranscribeOptions(**fields)


def test_transcribe_with_beams_is_exact_with_the_assistant(speech_real, registry):
    from pipelines.asr import TranscribeOptions, transcribe

    clip = next(i for i in speech_real if i["id"] == "goforward")["audio_path"]
    (t,) = transcribe([clip], registry.get("whisper-base+distilled"), TranscribeOptions(compare=True, beam_size=3))
    assert t.identical and "forward" in t.text.lower()


def test_best_of_draws_n_samples_at_a_fallback_and_keeps_whispers_best(speech_real, base_runner, monkeypatch):
    """A greedy window that fails the log-probability check (a threshold of 0 fails every decode) falls back to
    temperature 1.0, where best_of 5 draws five samples of the window in one seeded call and keeps the one with
    the highest sum_logprob / length (tokens without EOT): recomputed here from every sample the call drew. Fails
    where best_of is ignored (one sample a window) or the first sample is kept whatever its score."""
    from pipelines.asr import TranscribeOptions
    from pipelines.asr.safeguards import decide
    from pipelines.audio import load_audio

    engine = base_runner.loaded.engine
    sampled = []  # every sampled engine call: (prompts, options, result)
    generate = engine.generate

    def spy(prompts, rules, options, **kwargs):
        result = generate(prompts, rules, options, **kwargs)
        if options.do_sample:
            sampled.append((prompts, options, result))
        return result

    monkeypatch.setattr(engine, "generate", spy)
    clips = [c for c in speech_real if c["id"] in ("goforward", "forever", "cards-005")]
    enc, _ = base_runner.encode_windows([load_audio(c["audio_path"]) for c in clips])
    prompt = base_runner.prompt("en", "transcribe", timestamps=False)
    options = TranscribeOptions(temperature=(0.0, 1.0), best_of=5, logprob_threshold=0.0,
                                compression_ratio_threshold=None, no_speech_threshold=None)
    verdicts, calls = decide(base_runner, enc, [prompt] * len(clips), False, options, seeds=[11, 12, 13])
    assert [v.retried for v in verdicts] == [1] * len(clips)  # each window fell back once
    assert len(sampled) == len(clips)  # one sampled call a window
    first_kept = 0
    for (prompts, decode_options, drawn), (rows, kept) in zip(sampled, calls[1:]):
        assert len(prompts) == 5 and decode_options.sampling.temperature == 1.0 and decode_options.seed is not None
        samples = [list(t) for t in drawn.tokens]
        assert len({tuple(s) for s in samples}) > 1  # five draws, not one drawn five times
        scores = [s / max(1, len([t for t in toks if t != EOT])) for s, toks in zip(drawn.sum_logprobs, samples)]
        best = max(range(5), key=scores.__getitem__)
        assert list(kept.tokens[0]) == samples[best] and kept.sum_logprobs[0] == drawn.sum_logprobs[best]
        first_kept += best == 0
    assert first_kept < len(clips)  # the ranking chose: not always the first sample


@pytest.mark.parametrize("same_encoder", [False, True])
@torch.inference_mode()  # as the engine runs its drafters
def test_assistant_rows_follow_selections_when_it_next_drafts(setup, same_encoder):
    """Beam search relabels its beams every round (``drafter.select``): the assistant's cache and encoder output
    follow when it next drafts, the selections since composed into one copy (without the cross-attention keys
    and values where every selection kept each row's encoder output, as beams of one input do), and its drafts
    equal those of an assistant that copied everything at every selection."""
    _, _, engine, enc, rules = setup

    def started(clips):
        drafter = engine.make_drafter(rules, MAX_NEW)
        drafter.start([PROMPT] * 3, enc.select(torch.tensor(clips)), None)
        return drafter

    texts = started([0, 1, 2]).draft([4] * 3, [list(PROMPT)] * 3, [0] * 3, None, None, None).tokens
    clips = [0, 0, 0] if same_encoder else [0, 1, 2]  # beams of one input, or three inputs

    def primed():  # rows that said the three clips' openings, in the assistant's cache
        drafter = started(clips)
        drafter.update([[]] * 3, [0] * 3, texts)
        seqs = [list(PROMPT) + t for t in texts]
        first = drafter.draft([2] * 3, seqs, [len(t) for t in texts], None, None, None).tokens
        drafter.update(first, [len(t) for t in first], first)  # every draft kept
        return drafter, [s + t for s, t in zip(seqs, first)]

    (deferred, seqs), (eager, _) = primed(), primed()
    copies, select = [], deferred.cache.select
    deferred.cache.select = lambda rows, host, cross: (copies.append((host, cross)), select(rows, host, cross))[1]
    for keep in ([2, 0, 1], [1, 1, 2]):  # a relabelling, then two rows copying one
        deferred.select(keep, same_encoder)
        eager.select(keep)
        eager._reorder()
        seqs = [seqs[i] for i in keep]
    assert copies == []  # nothing copied while it does not draft
    lens = [len(s) - len(PROMPT) for s in seqs]
    drafts = deferred.draft([3] * 3, seqs, lens, None, None, None).tokens
    assert copies == [([0, 0, 1], not same_encoder)]  # one copy: row i is old row [2, 0, 1][[1, 1, 2][i]]
    assert drafts == eager.draft([3] * 3, seqs, lens, None, None, None).tokens
    assert drafts[0] == drafts[1] != drafts[2]
