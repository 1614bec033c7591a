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
    from pipelines.registry import load_registry

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
    from pipelines.registry import load_registry

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
