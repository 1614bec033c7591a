"""Tandem's assisted-decoding engine (encode once, draft, verify, accept). Knows nothing of audio, files or UI."""

from .beam import BeamOptions
from .beam_loop import beam_generate
from .core import AssistedDecoder, DecodeOptions, DecodeResult, DecodeStats
from .decoders import Decoder, EncoderOutput
from .drafters import Drafter, ModelDrafter, PromptLookup, model_drafter, prompt_lookup
from .families import as_decoder
from .policies import POLICIES, PolicyOptions, parse_policy
from .rules import Rules, Sampling, TimestampRules, rules_from_generation_config

__all__ = [
    "AssistedDecoder", "BeamOptions", "beam_generate", "DecodeOptions", "DecodeResult", "DecodeStats", "Decoder", "EncoderOutput", "as_decoder",
    "Drafter", "ModelDrafter", "PromptLookup", "model_drafter", "prompt_lookup", "POLICIES", "PolicyOptions", "parse_policy", "Rules", "Sampling",
    "TimestampRules", "rules_from_generation_config",
]
