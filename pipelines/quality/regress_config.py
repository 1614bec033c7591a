"""``tandem regress``'s config: its keys, thresholds and evaluations, read and validated in one place
(``load_config``) before anything runs. The format is in ``regress``'s docstring."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import TandemError
from ..models.registry import a_task, read_yaml
from .evaluation import SET_TASKS

LOWER_IS_BETTER = {"wer", "cer"}
METRICS = ("wer", "cer", "bleu", "chrf", "rouge1", "rouge2", "rougeL", "rougeLsum")
DEFAULT_THRESHOLDS = {
    "quality_drop": {"wer": 0.005, "cer": 0.005, "bleu": 1.0, "chrf": 1.0, "rouge1": 0.01, "rouge2": 0.01, "rougeL": 0.01},
    "identical_min": 1.0,
    "speedup_drop": 0.10,
    "noise_factor": 2.0,
    "tokens_per_call_drop": 0.15,
}
FRACTIONS = {"identical_min": (0.0, 1.0), "speedup_drop": (0.0, 0.99), "tokens_per_call_drop": (0.0, 0.99),
             "noise_factor": (0.0, 100.0)}
RUN_KEYS = {"task", "pair", "set", "limit", "dtype", "policy", "repeats", "temperature"}
TOP_KEYS = {"models", "out", "repeats", "baseline", "thresholds", "runs"}


class RegressConfigError(TandemError, ValueError):
    """The regression config cannot be used; the message names the field."""


class RegressRunError(TandemError, RuntimeError):
    """An evaluation could not run (a model or set that cannot be had); the message says which."""


@dataclass(frozen=True)
class EvalSpec:
    task: str
    pair: str
    set: str
    limit: int | None = None
    dtype: str | None = None
    policy: tuple[tuple[str, object], ...] = ()  # PolicyOptions fields
    repeats: int | None = None
    temperature: tuple[float, ...] | None = None  # asr: Whisper's temperature fallback (None: the default)

    @property
    def schedule(self) -> str:
        """The lookahead policy's name: "adaptive" (the default; k chosen from measured step costs, so its
        tokens per call depend on timing) or a fixed schedule (constant, heuristic, confidence, random:
        the same tokens per call on every run of the same code)."""
        return str(dict(self.policy).get("name", "adaptive"))

    @property
    def key(self) -> str:
        """What identifies this evaluation across runs: the pair, the data, the dtype and, for a fixed
        schedule, the policy's name (its tokens per call measure the assistant, the adaptive policy's measure
        the whole system: not comparable). Settings under test (the policy's lookahead, the models file behind
        the pair name) are not part of it: changing them is what a regression run is for."""
        key = f"{self.task}|{self.pair}|{self.set}|{self.limit or 'all'}|{self.dtype or 'pair'}"
        return key if self.schedule == "adaptive" else f"{key}|{self.schedule}"


@dataclass(frozen=True)
class Config:
    path: Path
    models: str | None
    out: Path
    repeats: int
    baseline: str | int
    thresholds: dict
    runs: tuple[EvalSpec, ...]


def _fail(path: Path, where: str, problem: str) -> RegressConfigError:
    return RegressConfigError(f"{path}: {where}: {problem}")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _positive_int(path: Path, where: str, v) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise _fail(path, where, f"must be a whole number of 1 or more (got {v!r})")
    return v


def _thresholds(path: Path, given) -> dict:
    thresholds = json.loads(json.dumps(DEFAULT_THRESHOLDS))
    if given is None:
        return thresholds
    if not isinstance(given, dict):
        raise _fail(path, "thresholds", "must be a mapping")
    for k, v in given.items():
        if k not in thresholds:
            raise _fail(path, f"thresholds.{k}", f"unknown threshold (expected {', '.join(thresholds)})")
        if k == "quality_drop":
            if not isinstance(v, dict):
                raise _fail(path, "thresholds.quality_drop", "must map metric names to non-negative numbers")
            for metric, x in v.items():
                if metric not in METRICS:
                    raise _fail(path, f"thresholds.quality_drop.{metric}", f"unknown metric (expected {', '.join(METRICS)})")
                if not _is_number(x) or x < 0:
                    raise _fail(path, f"thresholds.quality_drop.{metric}", f"must be a non-negative number (got {x!r})")
            thresholds[k].update(v)
            continue
        low, high = FRACTIONS[k]
        if not _is_number(v) or not low <= v <= high:
            raise _fail(path, f"thresholds.{k}", f"must be a number from {low:g} to {high:g} (got {v!r})")
        thresholds[k] = float(v)
    return thresholds


def _policy(path: Path, where: str, policy) -> tuple[tuple[str, object], ...]:
    from ..engine import POLICIES, PolicyOptions

    if policy is None:
        return ()
    fields = PolicyOptions.__dataclass_fields__
    if not isinstance(policy, dict) or set(policy) - set(fields):
        raise _fail(path, where, f"must be a mapping of {', '.join(fields)}")
    if "name" in policy and policy["name"] not in POLICIES:
        raise _fail(path, f"{where}.name", f"{policy['name']!r} is not one of {', '.join(POLICIES)}")
    for k in ("lookahead", "max_lookahead", "seed"):
        if k in policy and (not isinstance(policy[k], int) or isinstance(policy[k], bool) or policy[k] < (0 if k == "seed" else 1)):
            raise _fail(path, f"{where}.{k}", f"must be a whole number (got {policy[k]!r})")
    if "confidence" in policy and (not _is_number(policy["confidence"]) or not 0 < policy["confidence"] < 1):
        raise _fail(path, f"{where}.confidence", f"must be a number between 0 and 1 (got {policy['confidence']!r})")
    options = PolicyOptions(**policy)
    if options.lookahead > options.max_lookahead:
        raise _fail(path, f"{where}.lookahead", f"{options.lookahead} is above max_lookahead {options.max_lookahead}")
    return tuple(sorted(policy.items()))


def _check_pairs_and_sets(path: Path, models: str | None, runs: list[EvalSpec]) -> None:
    from ..models.registry import RegistryError, load_registry
    from .sets import SETS

    try:
        registry = load_registry(models)
    except RegistryError as exc:
        raise _fail(path, "models", str(exc)) from None
    for i, spec in enumerate(runs):
        try:
            pair = registry.get(spec.pair)
        except (RegistryError, KeyError) as exc:
            raise _fail(path, f"runs[{i}].pair", str(exc).strip("'\"")) from None
        if wrong := pair.task_mismatch(spec.task):
            raise _fail(path, f"runs[{i}].pair", f"{spec.pair!r} is {wrong}")
        if spec.set not in SETS:
            raise _fail(path, f"runs[{i}].set", f"unknown set {spec.set!r} (known: {', '.join(SETS)})")
        if SET_TASKS.get(spec.set.split("-")[0]) != spec.task:
            raise _fail(path, f"runs[{i}].set", f"{spec.set!r} is not {a_task(spec.task)} set")


def load_config(path: str | Path) -> Config:
    """Read and validate the whole regression config before anything runs (one place that validates).
    Raises RegressConfigError naming the file and the field."""
    from ..models.loading import DTYPES

    path = Path(path)
    raw, problem = read_yaml(path)
    if problem:
        raise RegressConfigError(f"{path}: {problem}")
    if not isinstance(raw, dict) or not isinstance(raw.get("runs"), list) or not raw["runs"]:
        raise RegressConfigError(f"{path}: must be a mapping with a non-empty 'runs' list")
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise _fail(path, sorted(unknown)[0], f"unknown key (expected {', '.join(sorted(TOP_KEYS))})")
    thresholds = _thresholds(path, raw.get("thresholds"))
    repeats = _positive_int(path, "repeats", raw.get("repeats", 3))
    runs = []
    for i, r in enumerate(raw["runs"]):
        where = f"runs[{i}]"
        if not isinstance(r, dict) or not {"task", "pair", "set"} <= set(r):
            raise _fail(path, where, "needs task, pair and set")
        if set(r) - RUN_KEYS:
            raise _fail(path, f"{where}.{sorted(set(r) - RUN_KEYS)[0]}", f"unknown key (expected {', '.join(sorted(RUN_KEYS))})")
        if r["task"] not in ("asr", "translate", "summarize"):
            raise _fail(path, f"{where}.task", f"{r['task']!r} is not asr, translate or summarize")
        if r.get("dtype") is not None and r["dtype"] not in DTYPES:
            raise _fail(path, f"{where}.dtype", f"{r['dtype']!r} is not one of {', '.join(DTYPES)}")
        temps = r.get("temperature")
        if temps is not None:
            temps = temps if isinstance(temps, list) else [temps]
            if r["task"] != "asr" or not temps or not all(_is_number(t) and 0 <= t <= 2 for t in temps) or temps != sorted(temps):
                raise _fail(path, f"{where}.temperature", "asr only: increasing numbers from 0 to 2 (Whisper's fallback)")
        runs.append(EvalSpec(r["task"], str(r["pair"]), str(r["set"]), _positive_int(path, f"{where}.limit", r.get("limit")),
                             r.get("dtype"), _policy(path, f"{where}.policy", r.get("policy")),
                             _positive_int(path, f"{where}.repeats", r.get("repeats")),
                             None if temps is None else tuple(float(t) for t in temps)))
    keys = [spec.key for spec in runs]
    if len(set(keys)) < len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise _fail(path, "runs", f"two runs measure the same evaluation {dup.replace('|', ' ')} (give them another limit or dtype)")
    base = path.parent
    models, out = raw.get("models"), raw.get("out", "reports/nightly")
    for key, value in (("models", models), ("out", out)):
        if value is not None and not isinstance(value, str) or key == "out" and not value:
            raise _fail(path, key, "must be a path (text), relative to the config")
    baseline = raw.get("baseline", "last")
    if baseline != "last" and (not isinstance(baseline, int) or isinstance(baseline, bool)):
        raise _fail(path, "baseline", "must be 'last' or a run id")
    models = str((base / models).resolve()) if models else None
    _check_pairs_and_sets(path, models, runs)
    out = (base / out).resolve()
    if out.exists() and not out.is_dir():
        raise _fail(path, "out", f"{out} exists and is not a folder")
    return Config(path, models, out, repeats, baseline, thresholds, tuple(runs))
