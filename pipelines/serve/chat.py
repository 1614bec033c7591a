"""Chat completions on a decoder-only text pair (the embedded Qwen pair): messages -> the model's chat
template -> Tandem's engine (drafts from the pair's assistant or prompt lookup) -> text."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..engine import DecodeOptions, Sampling, rules_from_generation_config
from ..errors import TandemError
from ..text import TextRunner

ROLES = ("system", "user", "assistant")
MAX_CHAT_CHARS = 200_000  # all messages together


class ChatInputError(TandemError, ValueError):
    """The messages or settings cannot be used (one sentence)."""


@dataclass(frozen=True)
class ChatSettings:
    """What rows must share to be decoded in one engine call."""

    max_tokens: int
    temperature: float = 0.0  # 0: greedy (lossless); above: exact speculative sampling at this temperature
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" or "length"
    main_calls: float  # this row's share of the batch's main-model passes
    drafted: float
    accepted: float
    decoder_seconds: float


class ChatEngine:
    """One chat pair loaded; ``prompt`` builds a request's token ids, ``complete`` decodes a batch of them."""

    def __init__(self, runner: TextRunner) -> None:
        if not runner.chat:
            raise ChatInputError(f"pair {runner.pair.name!r} is not a chat (decoder-only) model: "
                                 "/v1/chat/completions needs one, e.g. the embedded Qwen pair")
        self.runner = runner
        self.name = runner.pair.name
        self.context = runner.model.config.max_position_embeddings or 4096

    def prompt(self, messages: list[dict]) -> list[int]:
        """The chat template's token ids for ``messages`` (role and string content each), ending where the
        reply begins; ChatInputError for messages it cannot take."""
        if not messages:
            raise ChatInputError("messages must hold at least one message")
        clean = []
        for n, m in enumerate(messages):
            role, content = m.get("role"), m.get("content")
            if role not in ROLES:
                raise ChatInputError(f"messages[{n}].role must be one of {', '.join(ROLES)}, not {role!r}")
            if isinstance(content, list):  # OpenAI's content parts: text only
                if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                    raise ChatInputError(f"messages[{n}].content: only text parts are supported")
                content = "".join(str(p.get("text", "")) for p in content)
            if not isinstance(content, str):
                raise ChatInputError(f"messages[{n}].content must be a string")
            clean.append({"role": role, "content": content})
        if sum(len(m["content"]) for m in clean) > MAX_CHAT_CHARS:
            raise ChatInputError(f"the messages hold more than {MAX_CHAT_CHARS:,} characters")
        ids = self.runner.tok.apply_chat_template(clean, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def check(self, prompt: list[int], settings: ChatSettings) -> None:
        if len(prompt) + settings.max_tokens > self.context:
            raise ChatInputError(f"the prompt ({len(prompt)} tokens) and max_tokens ({settings.max_tokens}) exceed "
                                 f"the model's context of {self.context} tokens")

    def complete(self, prompts: list[list[int]], settings: ChatSettings,
                 on_tokens: Callable[[int, list[int]], bool] | None = None) -> list[ChatResult]:
        """Decode ``prompts`` together (one engine call), one result per prompt. ``on_tokens(row, tokens)``,
        when given, is told each row's tokens as the engine accepts them, round by round; returning False
        stops that row there (its client went away: the row leaves the batch, its result is cut short)."""
        runner = self.runner
        rules = rules_from_generation_config(runner.gen, max(map(len, prompts)), settings.max_tokens)
        sampled = settings.temperature > 0
        options = DecodeOptions(max_new_tokens=settings.max_tokens, do_sample=sampled, seed=settings.seed,
                                sampling=Sampling(temperature=settings.temperature, top_p=settings.top_p)
                                if sampled else Sampling())
        on_round = None
        if on_tokens is not None:
            def on_round(new: dict[int, list[int]]) -> list[int]:
                return [row for row, tokens in new.items() if not on_tokens(row, tokens)]
        result = runner.loaded.engine.generate(prompts, rules, options, on_round=on_round)
        stats, share = result.stats, 1.0 / len(prompts)
        eos = set(rules.eos)
        out = []
        for prompt, tokens in zip(prompts, result.tokens):
            ended = bool(tokens) and tokens[-1] in eos
            out.append(ChatResult(
                runner.tok.decode(list(tokens), skip_special_tokens=True).strip(), len(prompt), len(tokens),
                "stop" if ended or len(tokens) < settings.max_tokens else "length",
                stats.row_calls * share, stats.drafted * share, stats.accepted * share,
                (stats.total_s - stats.encode_s) * share))
        return out
