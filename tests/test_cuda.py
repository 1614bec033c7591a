"""On a CUDA GPU: the real Whisper pair loads there, every result of the engine stays there, and assisted
output equals plain output token for token in bfloat16 (the GPU default) and float32, one file at a time and
four at a time, under fixed and random lookahead schedules. Skipped, with the reason, where torch sees no
CUDA device (CI, the CPU machines)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device here (torch.cuda.is_available() is False): run on a GPU machine")


@pytest.fixture(scope="module")
def cuda_runner():
    from pipelines.asr import WhisperRunner
    from pipelines.devices import resolve_device
    from pipelines.models.registry import load_registry

    pair = load_registry().get("whisper-base+distilled")
    return WhisperRunner(pair, None, resolve_device("cuda"))


def test_the_pair_loads_on_the_gpu_in_half_precision(cuda_runner):
    loaded = cuda_runner.loaded
    assert loaded.device.startswith("cuda") and loaded.dtype in ("bfloat16", "float16")
    for model in (loaded.main_model, loaded.assistant_model):
        assert {p.device.type for p in model.parameters()} == {"cuda"}


def test_engine_results_stay_on_the_device(cuda_runner, speech_real):
    import numpy as np

    from pipelines.audio import load_audio

    enc, _ = cuda_runner.encode_windows([load_audio(speech_real[0]["audio_path"]).astype(np.float32)])
    assert enc.hidden.device.type == "cuda"
    prompt = cuda_runner.prompt("en", "transcribe", False)
    from pipelines.asr import TranscribeOptions

    result = cuda_runner.decode_encoded(enc, [prompt], False, TranscribeOptions(device=cuda_runner.device),
                                        no_speech=True)
    assert result.prompt_logits.device.type == "cuda" and result.tokens[0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("lookahead", ["constant:4", "random:1", "adaptive"])
def test_assisted_equals_plain_on_cuda(speech_real, dtype, lookahead):
    from pipelines.asr import TranscribeOptions, WhisperRunner, transcribe
    from pipelines.devices import resolve_device
    from pipelines.engine import parse_policy
    from pipelines.models.registry import load_registry

    device = resolve_device("cuda")
    pair = load_registry().get("whisper-base+distilled")
    runner = WhisperRunner(pair, dtype, device)
    paths = [i["audio_path"] for i in speech_real]
    for batch in (1, 4):
        options = TranscribeOptions(dtype=dtype, device=device, compare=True, batch_size=batch,
                                    policy=parse_policy(lookahead))
        results = list(transcribe(paths, pair, options, runner))
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        assert all(r.identical for r in results), [r.path for r in results if not r.identical]


def test_full_width_passes_replay_captured_graphs(cuda_runner, speech_real):
    """On CUDA the main decoder's caches come from its graph pool with a captured pass (graphs.py), and
    a second request of the same shape is lent the same cache and graph again."""
    from pipelines.asr import TranscribeOptions, transcribe

    decoder = cuda_runner.loaded.engine.main
    assert decoder.graphs == "capture"
    paths = [speech_real[0]["audio_path"]]
    options = TranscribeOptions(device=cuda_runner.device, batch_size=1)
    for _ in range(2):
        assert all(r.ok for r in transcribe(paths, cuda_runner.pair, options, cuda_runner))
    pooled = [c for caches in decoder._graph_pool.free.values() for c in caches]
    assert pooled and all(c.graph is not None and c.graph.graph is not None for c in pooled)
    assert len(pooled) == len(decoder._graph_pool.free)  # one cache per shape: lent again, not made again
    # greedy verification is chosen by a graph over the pass's output (fused_choice; the first round too where
    # the prompt and the drafts go through one pass)
    assert all(c.choices and all(g.graph is not None for g in c.choices.values()) for c in pooled)
    assert all(c.cross_graph is not None and c.cross_graph.graph is not None for c in pooled)


def test_at_most_two_synchronisations_a_round(cuda_runner, speech_real):
    """torch's sync debug mode warns at every operation that waits for the GPU: a greedy round of the
    engine waits twice (the drafts once, the verify pass's argmax once), whatever the rows."""
    import warnings
    from collections import Counter

    import numpy as np

    from pipelines.asr import TranscribeOptions
    from pipelines.audio import load_audio
    from pipelines.engine import PolicyOptions

    audio = [load_audio(i["audio_path"]).astype(np.float32) for i in speech_real[:4]]
    enc, _ = cuda_runner.encode_windows(audio)
    prompt = cuda_runner.prompt("en", "transcribe", False)
    options = TranscribeOptions(device=cuda_runner.device, policy=PolicyOptions("constant", 4))
    cuda_runner.decode_encoded(enc, [prompt] * len(audio), False, options)  # warm: graphs captured
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = cuda_runner.decode_encoded(enc, [prompt] * len(audio), False, options)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    # where they come from (the Python line that called the synchronising operation), most frequent first
    sites = Counter(f"{w.filename.rsplit('/', 1)[-1]}:{w.lineno}" for w in syncs).most_common()
    assert len(syncs) <= 2 * result.stats.rounds + 4, (len(syncs), result.stats.rounds, sites)


def test_graphs_replayed_with_ragged_rows_on_random_weights():
    """No weights needed: a random-weight Whisper base-shaped pair (bench_shapes' models) on CUDA, the main
    decoder's passes and the assistant's steps (one token, and a round's padded first feed) replayed from
    captured graphs, rows accepting
    different numbers of drafts (an oracle of acceptance 0.6): assisted equals plain token for token, in
    bfloat16 and float32."""
    import random

    from pipelines.engine import AssistedDecoder, DecodeOptions, PolicyOptions, Rules, as_decoder, model_drafter
    from pipelines.engine.decoders import EncoderOutput
    from pipelines.quality.bench_shapes import PROMPT, SHAPES, oracle, random_whisper

    spec = SHAPES["whisper-base"]
    for dtype in (torch.bfloat16, torch.float32):
        main = as_decoder(random_whisper(spec, spec["decoder_layers"], dtype, "cuda", causal=False, seed=0))
        assert main.graphs == "capture"
        lean = as_decoder(random_whisper(spec, 2, dtype, "cuda", causal=True, seed=1), assistant=True)
        assert lean.graphs == "capture"  # its one-token steps over a static cache (draft_cache.py)
        draft = model_drafter(lean, share_encoder=True, pad_id=0)
        torch.manual_seed(2)
        enc = EncoderOutput(torch.randn(3, 1500, spec["d_model"], dtype=dtype, device="cuda"), None)
        options = DecodeOptions(max_new_tokens=40, policy=PolicyOptions("constant", 4))
        plain = AssistedDecoder(main, None).generate([list(PROMPT)] * 3, Rules(), options, encoder_output=enc)
        reference = [list(t) for t in plain.tokens]
        engine = AssistedDecoder(main, oracle(draft, reference, 0.6, spec["vocab_size"], seed=random.randrange(100)))
        result = engine.generate([list(PROMPT)] * 3, Rules(), options, encoder_output=enc)
        assert [list(t) for t in result.tokens] == reference
        assert len(set(result.stats.accepted_hist)) > 1  # rows accepted different numbers of drafts
        pooled = [c for caches in main._graph_pool.free.values() for c in caches]
        assert pooled and all(c.graph is not None and c.graph.graph is not None for c in pooled)
        assert all(list(c.choices) == [((), False, None)] and c.choices[((), False, None)].graph is not None for c in pooled)  # no rules
        # the assistant's steps replayed with the draft loop's epilogue (draft_loop.py): its one-token steps
        # and the padded first feeds of a round (1, 2, 4 or 8 columns), every one captured
        pooled = [c for caches in lean._graph_pool.free.values() for c in caches]
        assert pooled and all(("step", 1) in {k[:2] for k in c.fused} for c in pooled)
        assert all(g.graph is not None for c in pooled for g in c.fused.values())


def test_bench_engine_on_the_gpu():
    """``tandem bench engine --device cuda``'s random-weight workloads: models and inputs on the GPU, every system
    (transformers plain and assisted, Tandem plain, assisted at batch 1 and 2) gives transformers' plain output."""
    from pipelines.quality import bench

    for w in bench.toy_workloads(n=3, device="cuda"):
        assert {p.device.type for p in w.assistant_model.parameters()} == {"cuda"}
        w.max_new_tokens = 6
        rows = bench.bench_workload(w, batches=(2,), log=lambda line: None)
        assert all(r.identical == 1.0 and r.tokens > 0 for r in rows), rows


def test_a_rows_log_softmax_has_the_same_bits_at_every_place():
    """``rows.aligned_rows`` and ``rows.rowwise_logsumexp``: with Whisper's 51,865-token vocabulary a
    position's log-softmax, and the timestamp rule's logsumexp over the timestamp columns, have the same bits
    whether its row stands alone (a plain step) or among others (a verify pass), in float32."""
    from pipelines.engine.rows import aligned_rows, rowwise_logsumexp

    torch.manual_seed(0)
    vocab = 51865
    x = 4 * torch.randn(2, 5, vocab, device="cuda")
    many = torch.log_softmax(aligned_rows(x), dim=-1)
    for b in range(2):
        for j in range(5):
            one = torch.log_softmax(aligned_rows(x[b, j][None, None].clone()), dim=-1)[0, 0]
            assert torch.equal(many[b, j], one), (b, j)
    flat = many.reshape(10, -1)[:, 50364:]  # the timestamp rule's reduction: N rows at once, then each alone
    together = rowwise_logsumexp(flat)
    for i in range(10):
        assert torch.equal(together[i], rowwise_logsumexp(flat[i : i + 1].clone())[0]), i
