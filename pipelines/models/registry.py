"""The pair registry (``models.yaml``): named (main model, assistant) pairs per task, validated in one place.

A broken file fails with one sentence naming the file, the pair and the field. The pre-flight check
(``preflight``) reads configs and tokenizers only, never weights: same vocabulary, matching ``d_model``
(and mel bins for Whisper) when the assistant reads the main model's encoder output, and task fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ..devices import WEIGHT_DTYPES
from ..errors import TandemError
from ..paths import PROJECT_ROOT
from .loading import DTYPES, ModelRef, ModelUnavailableError, is_available_offline, load_config, load_tokenizer

TASKS = ("asr", "translate", "summarize")
DRAFTERS = ("none", "model", "prompt-lookup", "model+prompt-lookup")
DEFAULT_FILE = PROJECT_ROOT / "models.yaml"

_PAIR_FIELDS = {
    "task", "main", "assistant", "draft", "share_encoder", "dtype", "languages", "description",
    "test_only", "prompt_lookup_ngram", "assistant_int8",
}


def a_task(task: str) -> str:
    """A task with its article, as messages name it: "an asr", "a translate"."""
    return ("an " if task[:1] in "aeiou" else "a ") + task


class RegistryError(TandemError, ValueError):
    """models.yaml is malformed; the message is one sentence naming file, pair and field."""


@dataclass(frozen=True)
class Pair:
    """One main model and how its drafts are made."""

    name: str
    task: str  # one of TASKS
    main: ModelRef  # the model whose output is the result
    assistant: ModelRef | None  # the drafting model, or None (plain decoding or prompt lookup alone)
    draft: str  # one of DRAFTERS: what proposes tokens
    share_encoder: bool  # the assistant reads the main model's encoder output instead of running its own
    dtype: str  # dtype of both models on a CPU: one of DTYPES, or of WEIGHT_DTYPES (int8/int4 weights, pairs.load_pair)
    languages: tuple[str, ...] = ()  # language codes the pair accepts (translation); empty = not restricted
    description: str = ""
    test_only: bool = False  # serves the engine's tests and benchmarks, hidden from users by default
    prompt_lookup_ngram: int = 3  # n-gram size when drafting by prompt lookup
    assistant_int8: bool = False  # the assistant's linear layers run with int8 weights (CPU; drafts only)

    @property
    def uses_assistant(self) -> bool:
        return self.draft != "none"

    def task_mismatch(self, task: str) -> str | None:
        """None when the pair serves ``task``; else what it is instead, as messages say it: "a translate pair,
        not an asr pair"."""
        return None if self.task == task else f"{a_task(self.task)} pair, not {a_task(task)} pair"


def missing_offline(pair: Pair) -> list[ModelRef]:
    """The pair's models (main, then assistant) that cannot be loaded offline now."""
    refs = [pair.main] + ([pair.assistant] if pair.assistant else [])
    return [r for r in refs if not is_available_offline(r)]


@dataclass(frozen=True)
class Registry:
    path: Path
    pairs: dict[str, Pair]
    defaults: dict[str, str]  # task -> pair name

    def get(self, name: str) -> Pair:
        if name not in self.pairs:
            known = ", ".join(sorted(self.pairs))
            raise RegistryError(f"{self.path}: no pair named {name!r}; known pairs: {known}")
        return self.pairs[name]

    def default(self, task: str) -> Pair:
        if task not in self.defaults:
            raise RegistryError(f"{self.path}: no default pair for task {task!r}")
        return self.pairs[self.defaults[task]]

    def for_task(self, task: str, include_test: bool = False) -> list[Pair]:
        return [p for p in self.pairs.values() if p.task == task and (include_test or not p.test_only)]


def _fail(path: Path, pair: str | None, fld: str | None, problem: str) -> RegistryError:
    where = f"{path}: "
    if pair is not None:
        where += f"pair {pair!r}: "
    if fld is not None:
        where += f"field {fld!r} "
    return RegistryError(where + problem)


def _parse_ref(path: Path, pair: str, fld: str, raw: Any) -> ModelRef | None:
    if raw is None or raw == "none":
        return None
    if not isinstance(raw, dict):
        raise _fail(path, pair, fld, "must be a mapping with one of hub, local or embedded (or none)")
    unknown = set(raw) - {"hub", "local", "embedded", "revision"}
    if unknown:
        raise _fail(path, pair, fld, f"has unknown key {sorted(unknown)[0]!r}")
    sources = [s for s in ("hub", "local", "embedded") if s in raw]
    if len(sources) != 1:
        raise _fail(path, pair, fld, "must name exactly one of hub, local or embedded")
    source = sources[0]
    ident = raw[source]
    if not isinstance(ident, str) or not ident.strip():
        raise _fail(path, pair, fld, f"has an empty {source} name")
    if "revision" in raw and source != "hub":
        raise _fail(path, pair, fld, "may give a revision only for a hub model")
    if source == "local" and not Path(ident).is_absolute():
        ident = str((path.parent / ident).resolve())
    if source == "embedded":
        from .embedded import embedded_names

        if ident not in embedded_names():
            raise _fail(path, pair, fld, f"names unknown embedded model {ident!r} (known: {', '.join(embedded_names())})")
    return ModelRef(source=source, id=ident, revision=raw.get("revision"))


def _parse_pair(path: Path, name: str, raw: Any) -> Pair:
    if not isinstance(raw, dict):
        raise _fail(path, name, None, "must be a mapping of fields")
    unknown = set(raw) - _PAIR_FIELDS
    if unknown:
        raise _fail(path, name, sorted(unknown)[0], f"is not a known field (known: {', '.join(sorted(_PAIR_FIELDS))})")
    for required in ("task", "main"):
        if required not in raw:
            raise _fail(path, name, required, "is missing")
    task = raw["task"]
    if task not in TASKS:
        raise _fail(path, name, "task", f"is {task!r}, expected one of {', '.join(TASKS)}")
    main = _parse_ref(path, name, "main", raw["main"])
    if main is None:
        raise _fail(path, name, "main", "cannot be none")
    assistant = _parse_ref(path, name, "assistant", raw.get("assistant"))
    draft = raw.get("draft", "model" if assistant else "none")
    if draft not in DRAFTERS:
        raise _fail(path, name, "draft", f"is {draft!r}, expected one of {', '.join(DRAFTERS)}")
    if draft.startswith("model") and assistant is None:
        raise _fail(path, name, "assistant", f"is missing but draft is {draft!r}")
    if not draft.startswith("model") and assistant is not None:
        raise _fail(path, name, "draft", f"is {draft!r} but an assistant is given")
    dtype = raw.get("dtype", "float32")
    if dtype not in DTYPES + WEIGHT_DTYPES:
        raise _fail(path, name, "dtype", f"is {dtype!r}, expected one of {', '.join(DTYPES + WEIGHT_DTYPES)}")
    share = raw.get("share_encoder", False)
    if not isinstance(share, bool):
        raise _fail(path, name, "share_encoder", "must be true or false")
    if share and assistant is None:
        raise _fail(path, name, "share_encoder", "is true but the pair has no assistant")
    languages = raw.get("languages", [])
    if not isinstance(languages, list) or not all(isinstance(x, str) and x for x in languages):
        raise _fail(path, name, "languages", "must be a list of language codes")
    ngram = raw.get("prompt_lookup_ngram", 3)
    if not isinstance(ngram, int) or isinstance(ngram, bool) or not 1 <= ngram <= 10:
        raise _fail(path, name, "prompt_lookup_ngram", "must be an integer from 1 to 10")
    test_only = raw.get("test_only", False)
    if not isinstance(test_only, bool):
        raise _fail(path, name, "test_only", "must be true or false")
    int8 = raw.get("assistant_int8", False)
    if not isinstance(int8, bool):
        raise _fail(path, name, "assistant_int8", "must be true or false")
    if int8 and assistant is None:
        raise _fail(path, name, "assistant_int8", "is true but the pair has no assistant")
    return Pair(
        name=name, task=task, main=main, assistant=assistant, draft=draft, share_encoder=share,
        dtype=dtype, languages=tuple(languages), description=str(raw.get("description", "")).strip(),
        test_only=test_only, prompt_lookup_ngram=ngram, assistant_int8=int8,
    )


class _KeyGivenTwice(yaml.constructor.ConstructorError):
    """A mapping names one key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names one key twice (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise _KeyGivenTwice(None, None, f"key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> tuple[object | None, str | None]:
    """A YAML file's contents, or None and why it cannot be had (unreadable, not UTF-8, not YAML, a key given
    twice in one mapping), as one phrase with the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    except UnicodeDecodeError as exc:
        return None, f"is not UTF-8 text (at byte offset {exc.start})"
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader), None  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        return None, f"{exc.problem} (YAML{line})" if isinstance(exc, _KeyGivenTwice) else f"is not valid YAML{line}"


def load_registry(path: str | Path | None = None) -> Registry:
    """Read and validate a models file (default: the project's models.yaml, or ``$TANDEM_MODELS``)."""
    import os

    path = Path(path or os.environ.get("TANDEM_MODELS") or DEFAULT_FILE)
    raw, problem = read_yaml(path)
    if problem:
        raise RegistryError(f"{path}: {problem}")
    if not isinstance(raw, dict):
        raise RegistryError(f"{path}: must be a mapping with 'pairs' and 'defaults'")
    unknown = set(raw) - {"pairs", "defaults"}
    if unknown:
        raise RegistryError(f"{path}: unknown top-level key {sorted(unknown)[0]!r} (expected pairs, defaults)")
    raw_pairs = raw.get("pairs")
    if not isinstance(raw_pairs, dict) or not raw_pairs:
        raise RegistryError(f"{path}: 'pairs' must be a non-empty mapping of pair names to fields")
    pairs = {str(n): _parse_pair(path, str(n), body) for n, body in raw_pairs.items()}
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise RegistryError(f"{path}: 'defaults' must map tasks to pair names")
    for task, name in defaults.items():
        if not isinstance(name, str):
            raise RegistryError(f"{path}: defaults: {task} must name one pair, not {name!r}")
        if task not in TASKS:
            raise RegistryError(f"{path}: defaults: {task!r} is not a task (expected {', '.join(TASKS)})")
        if name not in pairs:
            raise RegistryError(f"{path}: defaults: {task} names pair {name!r}, which is not defined")
        if pairs[name].task != task:
            raise RegistryError(f"{path}: defaults: {task} names pair {name!r}, which is {a_task(pairs[name].task)} pair")
    return Registry(path=path, pairs=pairs, defaults=dict(defaults))


# ----------------------------------------------------------------------------------------------------
# Pre-flight: configs and tokenizers only


@dataclass(frozen=True)
class Verdict:
    """The pre-flight result. ``ok`` is None when it could not be checked (e.g. offline, not cached)."""

    ok: bool | None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> str:
        if self.ok is None:
            return "not checked: " + "; ".join(self.notes or self.problems)
        if self.ok:
            return "ok" + (f" ({'; '.join(self.notes)})" if self.notes else "")
        return "FAIL: " + "; ".join(self.problems)


def _is_whisper(config) -> bool:
    return getattr(config, "model_type", None) == "whisper" or hasattr(config, "num_mel_bins")


def _task_problems(pair: Pair, main_cfg, asst_cfg) -> list[str]:
    problems: list[str] = []
    if pair.task == "asr" and not (_is_whisper(main_cfg) and main_cfg.is_encoder_decoder):
        problems.append(f"main model is a {main_cfg.model_type} model, not a speech encoder-decoder")
    if pair.task != "asr" and _is_whisper(main_cfg):
        problems.append(f"main model is a speech model, not fit for {pair.task}")
    if asst_cfg is None:
        return problems
    if _is_whisper(main_cfg) != _is_whisper(asst_cfg):
        problems.append(f"main model is {main_cfg.model_type} but assistant is {asst_cfg.model_type}")
    if not main_cfg.is_encoder_decoder and asst_cfg.is_encoder_decoder:
        problems.append("a decoder-only main model needs a decoder-only assistant")
    return problems


def _encoder_problems(pair: Pair, main_cfg, asst_cfg) -> list[str]:
    if not pair.share_encoder or asst_cfg is None:
        return []
    problems = []
    if not main_cfg.is_encoder_decoder:
        problems.append("share_encoder is true but the main model has no encoder")
    main_d, asst_d = getattr(main_cfg, "d_model", None), getattr(asst_cfg, "d_model", None)
    if main_d != asst_d:
        problems.append(f"d_model differs (main {main_d}, assistant {asst_d}) so the encoder output cannot be shared")
    if _is_whisper(main_cfg) and _is_whisper(asst_cfg) and main_cfg.num_mel_bins != asst_cfg.num_mel_bins:
        problems.append(f"mel bins differ (main {main_cfg.num_mel_bins}, assistant {asst_cfg.num_mel_bins})")
    return problems


def _tokenizer_problems(main_tok, asst_tok, main_cfg, asst_cfg) -> list[str]:
    problems = []
    if main_tok.get_vocab() != asst_tok.get_vocab():
        problems.append(f"tokenizers differ (main {len(main_tok)} tokens, assistant {len(asst_tok)})")
    if main_cfg.vocab_size != asst_cfg.vocab_size:
        problems.append(f"vocab_size differs (main {main_cfg.vocab_size}, assistant {asst_cfg.vocab_size})")
    for attr in ("eos_token_id", "decoder_start_token_id", "pad_token_id"):
        a, b = getattr(main_cfg, attr, None), getattr(asst_cfg, attr, None)
        if a is not None and b is not None and a != b:
            problems.append(f"{attr} differs (main {a}, assistant {b})")
    return problems


# Pre-flight only reads tokenizers (vocabularies, special ids), so pairs that share a model share its
# tokenizer: `tandem models` reads the Qwen tokenizer twice instead of six times (~0.8 s each).
_tokenizer = lru_cache(maxsize=16)(load_tokenizer)


def preflight(pair: Pair, online: bool = False) -> Verdict:
    """Check a pair from configs and tokenizers alone; nothing heavier is loaded.

    Models not available offline are not fetched unless ``online`` is true (then only their configs
    and tokenizers are downloaded).
    """
    missing = [str(r) for r in missing_offline(pair)]
    if missing and not online:
        return Verdict(ok=None, notes=(f"{', '.join(missing)} not available offline",))
    try:
        main_cfg = load_config(pair.main)
        asst_cfg = load_config(pair.assistant) if pair.assistant else None
        main_tok = _tokenizer(pair.main)
        asst_tok = _tokenizer(pair.assistant) if pair.assistant else None
    except ModelUnavailableError as exc:
        note = f"{', '.join(missing)} not available offline" if missing else str(exc)
        return Verdict(ok=None, notes=(note,))
    problems = _task_problems(pair, main_cfg, asst_cfg) + _encoder_problems(pair, main_cfg, asst_cfg)
    if asst_tok is not None:
        problems += _tokenizer_problems(main_tok, asst_tok, main_cfg, asst_cfg)
    notes = []
    if pair.draft == "none":
        notes.append("plain decoding: no assistant")
    return Verdict(ok=not problems, problems=tuple(problems), notes=tuple(notes))
