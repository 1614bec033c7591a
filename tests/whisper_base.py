"""What the engine tests on the embedded Whisper base share (test_engine_whisper.py, test_beam.py): its prompt
and end of text, the models loaded from the embedded weights, the features of real clips."""

from __future__ import annotations

import torch

from pipelines.models.embedded import ASSISTANTS_DIR, embedded_path

PROMPT = [50258, 50259, 50359, 50363]  # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
EOT = 50257


def strip_eot(tokens) -> list[int]:
    """``tokens`` as a list, less a final end of text (what transformers' ``generate`` returns after the prompt)."""
    return list(tokens[:-1]) if tokens and tokens[-1] == EOT else list(tokens)


def distilled_shipped() -> bool:
    """Whether the distilled assistant is shipped with the registry package."""
    return (ASSISTANTS_DIR / "whisper-base-distilled" / "assistant.json").is_file()


def assistant_name() -> str:
    """The embedded assistant the tests draft with: the distilled one, else Whisper base's first two layers."""
    return "whisper-base-distilled" if distilled_shipped() else "whisper-base-decoder-2l"


def whisper_base(dtype: torch.dtype = torch.float32):
    """The embedded Whisper base (``WhisperForConditionalGeneration``) in ``dtype``, eval mode."""
    from transformers import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(embedded_path("whisper-base"), dtype=dtype).eval()


def causal_lm(name: str, dtype: torch.dtype = torch.float32):
    """An embedded decoder-only Whisper model (``WhisperForCausalLM``: an assistant, a truncated decoder)."""
    from transformers import WhisperForCausalLM

    return WhisperForCausalLM.from_pretrained(embedded_path(name), dtype=dtype).eval()


def features(clips) -> torch.Tensor:
    """Whisper base's log-mel features of ``clips`` (audio file paths, or 16 kHz float32 arrays of at most
    30 s), (clips, 80, 3000) float32."""
    import numpy as np
    from transformers import WhisperFeatureExtractor

    from pipelines.audio import load_audio

    fe = WhisperFeatureExtractor.from_pretrained(embedded_path("whisper-base"))
    audio = [c if isinstance(c, np.ndarray) else load_audio(c) for c in clips]
    return torch.cat([fe(a, sampling_rate=16000, return_tensors="pt").input_features for a in audio])
