"""``WhisperRunner``: one ASR pair loaded once, its features, encoder pass, prompts and decoding rules."""

from __future__ import annotations

import time
from functools import cached_property

import numpy as np

from ..engine import (
    AssistedDecoder,
    BeamOptions,
    DecodeOptions,
    DecodeResult,
    EncoderOutput,
    Rules,
    Sampling,
    TimestampRules,
    beam_generate,
    rules_from_generation_config,
)
from ..engine.beam import rank_score
from ..models.pairs import load_pair
from ..models.registry import Pair
from .features import Span, as_span, log_mel, loudest_frame, mel_filters
from .options import LanguageError, TranscribeOptions
from .prompts import MAX_PROMPT_TOKENS, PromptTooLongError, prompt_tokens


def check_language(name: str, generation_config, options: TranscribeOptions) -> None:
    """Raise LanguageError (one sentence) when pair ``name``'s main model (its ``generation_config``, which the
    weights need not be loaded for: ``preflight_language``) cannot do what ``options`` ask: an English-only model
    given a language other than English (or None, which it takes as English) or the translate task, a
    multilingual model given a language it has no token for."""
    if not getattr(generation_config, "is_multilingual", False):
        if options.language not in (None, "en"):
            raise LanguageError(f"pair {name!r} is English-only: the language must be en or auto, "
                                f"not {options.language!r} (choose a multilingual pair)")
        if options.task != "transcribe":
            raise LanguageError(f"pair {name!r} is English-only: it cannot {options.task} (choose a multilingual pair)")
    elif options.language is not None and f"<|{options.language}|>" not in (generation_config.lang_to_id or {}):
        raise LanguageError(f"language {options.language!r} is not one pair {name!r} knows")


def preflight_language(pair: Pair, options: TranscribeOptions) -> None:
    """``check_language`` from the main model's generation_config.json alone, before any weights load; a model
    whose config cannot be had here (not offline) is left to loading, which says why."""
    from ..models.loading import ModelUnavailableError, load_generation_config

    try:
        generation_config = load_generation_config(pair.main)
    except ModelUnavailableError:
        return
    check_language(pair.name, generation_config, options)


def check_prompts(tokenizer, options: TranscribeOptions) -> None:
    """PromptTooLongError when ``initial_prompt``, ``hotwords`` or ``prefix`` (or all of them, which share the
    first half of Whisper's 448-token context) is longer than ``MAX_PROMPT_TOKENS`` tokens of ``tokenizer``
    (openai/whisper would keep only the last prompt tokens, faster-whisper the first, without a word)."""
    texts = {"initial_prompt": options.initial_prompt, "hotwords": options.hotwords, "prefix": options.prefix}
    counts = {name: len(prompt_tokens(tokenizer, text)) for name, text in texts.items()}
    for name, n in counts.items():
        if n > MAX_PROMPT_TOKENS:
            raise PromptTooLongError(f"{name} is {n} tokens; Whisper reads at most {MAX_PROMPT_TOKENS} (half its "
                                     f"448-token context, less one): shorten it")
    given = [name for name, n in counts.items() if n]
    if sum(counts.values()) > MAX_PROMPT_TOKENS:
        raise PromptTooLongError(f"{' and '.join(given)} together are {sum(counts.values())} tokens; Whisper's "
                                 f"prompt holds at most {MAX_PROMPT_TOKENS}: shorten one")


def preflight_prompts(pair: Pair, options: TranscribeOptions) -> None:
    """``check_prompts`` with the main model's tokenizer alone, before any weights load (a model whose
    tokenizer cannot be had here is left to loading, which says why)."""
    if not (options.initial_prompt or options.hotwords or options.prefix):
        return
    from ..models.loading import ModelUnavailableError, load_tokenizer

    try:
        tokenizer = load_tokenizer(pair.main)
    except ModelUnavailableError:
        return
    check_prompts(tokenizer, options)


class WhisperRunner:
    """Holds one pair's models, tokenizer and feature extractor; never mutated per request."""

    def __init__(self, pair: Pair, dtype: str | None = None, device: str = "cpu") -> None:
        """Load ``pair`` on ``device`` ("cpu", "cuda:0": ``devices.resolve_device``) in ``dtype`` (default:
        ``devices.resolve_dtype``'s). Raises ModelUnavailableError when a model cannot be had."""
        import torch
        from transformers import WhisperFeatureExtractor

        from ..models.loading import resolve

        self.pair = pair
        self.loaded = load_pair(pair, dtype, device)
        self.model = self.loaded.main_model
        self.tokenizer = self.loaded.tokenizer
        where, kwargs = resolve(pair.main)
        self.features = WhisperFeatureExtractor.from_pretrained(where, **kwargs)
        self._torch = torch

    @property
    def device(self) -> str:
        """Where the pair's models live ("cpu", "cuda:0")."""
        return self.loaded.device

    @cached_property
    def multilingual(self) -> bool:
        """False for an English-only (``.en``) model: no language or task token, language always English."""
        return bool(getattr(self.model.generation_config, "is_multilingual", False))

    def check_language(self, options: TranscribeOptions) -> None:
        """``check_language`` with this model's generation config."""
        check_language(self.pair.name, self.model.generation_config, options)

    @cached_property
    def sot_prev(self) -> int | None:
        """<|startofprev|>, which opens a text prompt (None for a model without one: no prompts)."""
        return self.tokenizer.get_vocab().get("<|startofprev|>")

    @cached_property
    def timestamp_begin(self) -> int:
        return self.model.generation_config.no_timestamps_token_id + 1

    def encode(self, features):
        """The main encoder's output for these log-mel features (``feats``), (windows, frames, d_model)."""
        with self._torch.inference_mode():
            return self.loaded.plain.main.encode(input_features=features).hidden

    @cached_property
    def language_ids(self) -> list[int]:
        """The language tokens' ids (<|en|>, <|de|>, ...) of a multilingual model, in its generation config's order."""
        return list(self.model.generation_config.lang_to_id.values())

    def languages_of(self, hidden) -> list[tuple[str, float]]:
        """Whisper's language detection (openai/whisper ``detect_language``, transformers' ``detect_language``)
        from windows' encoder output (``encode``: (windows, frames, d_model)), so that each window's encoder
        pass also serves its decoding: per window (code, probability).

        p(lang) = softmax over the language tokens of the main model's logits after <|startoftranscript|>;
        the language is the argmax (transformers' choice), its probability whisper's ``language_probs``."""
        from transformers.modeling_outputs import BaseModelOutput

        torch = self._torch
        sot = self.model.generation_config.decoder_start_token_id
        start = torch.full((hidden.shape[0], 1), sot, dtype=torch.long, device=hidden.device)
        with torch.inference_mode():
            logits = self.model(encoder_outputs=BaseModelOutput(last_hidden_state=hidden), decoder_input_ids=start,
                                use_cache=False).logits[:, -1, self.language_ids].float()
        probs = torch.softmax(logits, dim=-1)
        best = probs.argmax(-1).tolist()
        names = self.tokenizer.convert_ids_to_tokens([self.language_ids[b] for b in best])
        return [(name[2:-2], float(probs[i, b])) for i, (name, b) in enumerate(zip(names, best))]

    def prompt(self, language: str | None, task: str, timestamps: bool) -> list[int]:
        """<|startoftranscript|> [<|lang|> <|task|>] [<|notimestamps|>]."""
        gen = self.model.generation_config
        tokens = [gen.decoder_start_token_id]
        if self.multilingual:
            key = f"<|{language or 'en'}|>"
            if key not in gen.lang_to_id:
                raise ValueError(f"language {language!r} is not one this model knows")
            tokens += [gen.lang_to_id[key], gen.task_to_id[task]]
        return tokens if timestamps else tokens + [gen.no_timestamps_token_id]

    def rules(self, prompt_len: int, timestamps: bool, max_new: int, forced: int = 0) -> Rules:
        """The decoding rules after a prompt of ``prompt_len`` tokens whose last ``forced`` are a forced prefix
        ([<|0.00|>] and ``prefix``'s text, ``forced_len``): the timestamp rules count them as generated, as
        faster-whisper's forced prefix is; the others start after them (openai/whisper's ``sample_begin``)."""
        from dataclasses import replace

        gen = self.model.generation_config
        rules = rules_from_generation_config(gen, prompt_len, max_new)
        if timestamps:
            rules = replace(rules, timestamps=TimestampRules.from_generation_config(gen, prompt_len - forced))
        return rules

    def forced_len(self, prompt: list[int], timestamps: bool) -> int:
        """The tokens of a window's ``prompt`` after its start-of-transcript sequence: its forced prefix."""
        sot = self.model.generation_config.decoder_start_token_id
        return len(prompt) - prompt.index(sot) - len(self.prompt("en", "transcribe", timestamps))

    @cached_property
    def mel_filters(self):
        """The feature extractor's mel filters, (80 or 128 mels, 201) float32 on the model's device."""
        return mel_filters(self.features, self.device)

    def feats(self, windows: list[np.ndarray | Span]):
        """openai/whisper's log-mel features of ``windows`` (``features.log_mel``: the slice of the file's log-mel,
        its floor 8 below the file's loudest frame, zeros after the content frames): (windows, 80 or 128 mels,
        3000 frames) on the model's device in its dtype. A window is a ``features.Span`` (16 kHz samples, at
        most 30 s, with the file around them) or a bare array, a whole file (over 30 s: its first window). On a
        GPU the transform runs there: on an H200's host (16 cores) the CPU's short-time Fourier transform took
        0.3 s of a 1.0 s transcription of speech-real's 12 files (cProfile)."""
        x = log_mel([as_span(w, self.mel_filters, self.device) for w in windows], self.mel_filters, self.device)
        return x.to(device=self.device, dtype=self.model.dtype)

    def loudest_frame(self, blocks) -> float:
        """A file's loudest log-mel frame from its blocks of samples (``features.loudest_frame``)."""
        return loudest_frame(blocks, self.mel_filters, self.device)

    @cached_property
    def no_speech_id(self) -> int | None:
        """<|nospeech|> (<|nocaptions|> in the older vocabularies), or None when the model has neither."""
        vocab = self.tokenizer.get_vocab()
        return next((vocab[t] for t in ("<|nospeech|>", "<|nocaptions|>") if t in vocab), None)

    def encode_windows(self, windows: list[np.ndarray | Span], encoded: list | None = None) -> tuple[EncoderOutput, float]:
        """The encoder output for ``windows`` (windows, frames, d_model), reusing the ones already computed
        (``encoded``: per window, a language detection's output or None), and the seconds it took."""
        start = time.perf_counter()
        x = self.feats(windows)
        encoded = encoded or [None] * len(windows)
        missing = [i for i, h in enumerate(encoded) if h is None]
        fresh = iter(self.encode(x[missing]) if missing else [])
        hidden = self._torch.stack([h if h is not None else next(fresh) for h in encoded])
        return EncoderOutput(hidden, None), time.perf_counter() - start

    def no_speech_probs(self, result) -> list[float | None]:
        """p(<|nospeech|>) at the first decoding step of each window (Whisper's no_speech_prob): the softmax
        of the main model's logits at <|startoftranscript|>, which the engine returns with the decode
        (``decode_encoded(..., no_speech=True)``)."""
        if self.no_speech_id is None or result.prompt_logits is None:
            return [None] * len(result.tokens)
        return self._torch.softmax(result.prompt_logits, dim=-1)[:, self.no_speech_id].tolist()

    def decoding(self, prompt: list[int], timestamps: bool, options: TranscribeOptions, temperature: float = 0.0,
                 seed: int | None = None, no_speech: bool = False) -> tuple[Rules, DecodeOptions]:
        """The engine's rules and options for windows of ``prompt``'s length and forced prefix (``decode_encoded``'s,
        and a continuous batch's): greedy at temperature 0, else speculative sampling seeded with ``seed``;
        ``no_speech``: the logits at <|startoftranscript|> too."""
        rules = self.rules(len(prompt), timestamps, options.max_new_tokens, self.forced_len(prompt, timestamps))
        sampled = temperature > 0
        return rules, DecodeOptions(max_new_tokens=options.max_new_tokens, policy=options.policy, do_sample=sampled,
                                    sampling=Sampling(temperature=temperature) if sampled else Sampling(), seed=seed,
                                    compare_plain=options.compare and options.use_assistant and not sampled,
                                    logits_at=prompt.index(self.model.generation_config.decoder_start_token_id)
                                    if no_speech else None)

    def engine_for(self, options: TranscribeOptions) -> AssistedDecoder:
        """The loaded pair's engine: with its assistant, or plain (``options.use_assistant``)."""
        return self.loaded.engine if options.use_assistant else self.loaded.plain

    def decode_encoded(self, enc: EncoderOutput, prompts: list[list[int]], timestamps: bool, options: TranscribeOptions,
                       temperature: float = 0.0, seed: int | None = None, no_speech: bool = False):
        """One engine call over encoded windows of several files (of one prompt length and one forced prefix
        length, ``forced_len``): greedy at temperature 0 (with compare, also plainly), or beam search with
        ``options.beam_size``; else speculative sampling at ``temperature``, ``options.best_of`` samples a window
        with the best kept (``best_of``). ``no_speech``: also return the logits at <|startoftranscript|>
        (``no_speech_probs``)."""
        rules, decode_options = self.decoding(prompts[0], timestamps, options, temperature, seed, no_speech)
        sampled = temperature > 0
        engine = self.engine_for(options)
        if not sampled and options.beam_size is not None:
            beam = BeamOptions(options.beam_size, options.patience, options.length_penalty)
            return beam_generate(engine, prompts, rules, decode_options, beam, encoder_output=enc)
        if sampled and (options.best_of or 1) > 1:
            return self.best_of(engine, enc, prompts, rules, decode_options, options)
        return engine.generate(prompts, rules, decode_options, encoder_output=enc)

    def best_of(self, engine, enc: EncoderOutput, prompts: list[list[int]], rules: Rules, decode_options: DecodeOptions,
                options: TranscribeOptions) -> DecodeResult:
        """whisper's best_of: ``options.best_of`` samples of each window in one sampled call (row w * n + i the
        i-th of window w), and per window the one whisper's ranker puts first: the highest sum_logprob / length
        (tokens without EOT), or / ((5 + length) / 6) ** length_penalty (``beam.rank_score``; the first on a tie)."""
        torch, n = self._torch, options.best_of
        rows = [w for w in range(len(prompts)) for _ in range(n)]
        result = engine.generate([prompts[w] for w in rows], rules, decode_options,
                                 encoder_output=enc.select(torch.tensor(rows, device=enc.hidden.device)))
        eot = self.model.generation_config.eos_token_id
        chosen = []
        for w in range(len(prompts)):
            ranked = [rank_score(result.sum_logprobs[r], len([t for t in result.tokens[r] if t != eot]),
                                 options.length_penalty) for r in range(w * n, (w + 1) * n)]
            chosen.append(w * n + max(range(n), key=ranked.__getitem__))
        logits = None if result.prompt_logits is None else result.prompt_logits[chosen]
        return DecodeResult(tuple(result.tokens[r] for r in chosen), result.stats,
                            sum_logprobs=tuple(result.sum_logprobs[r] for r in chosen), prompt_logits=logits)

    def text_of(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True).strip()
