"""Tandem's Streamlit pages: Translate, Summarize and Transcribe.

Each page: a pair selector (availability from the registry), the input, a Run button, the output, the
assisted run's speed (and, when asked, plain decoding of the same input side by side: speedup and the
identical-output check), a quality score against a pasted reference, and a small chart. Models are held
with ``st.cache_resource`` (one runner per pair and registry file) and never mutated per request.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines.audio import AudioDecodeError  # noqa: E402
from pipelines.loading import ModelUnavailableError  # noqa: E402
from pipelines.registry import Pair, RegistryError, load_registry, missing_offline  # noqa: E402
from pipelines.text import MAX_INPUT_CHARS, TextInputError, TextOptions  # noqa: E402

UPLOAD_LIMIT_MB = 200  # also server.maxUploadSize in ui/.streamlit/config.toml
AUDIO_TYPES = ["wav", "flac", "mp3", "m4a", "ogg", "opus", "mp4", "webm", "mkv"]
TITLES = {"translate": "Translate", "summarize": "Summarize", "asr": "Transcribe"}


def models_file() -> str | None:
    return os.environ.get("TANDEM_MODELS") or None


@st.cache_resource(show_spinner="Loading the models (once per pair)...")
def text_runner(pair_name: str, models: str | None):
    from pipelines.text import TextRunner

    return TextRunner(load_registry(models).get(pair_name))


@st.cache_resource(show_spinner="Loading the models (once per pair)...")
def whisper_runner(pair_name: str, models: str | None):
    from pipelines.asr import WhisperRunner

    return WhisperRunner(load_registry(models).get(pair_name))


def availability(pair: Pair) -> str:
    missing = missing_offline(pair)
    return "ready" if not missing else "needs download: " + ", ".join(map(str, missing))


def choose_pair(task: str) -> Pair | None:
    """The pair selector; None (with the reason shown) when the registry cannot be read."""
    try:
        registry = load_registry(models_file())
    except RegistryError as exc:
        st.error(f"The model registry cannot be read: {exc}")
        return None
    pairs = [p for p in registry.pairs.values() if p.task == task and not p.test_only]
    if not pairs:
        st.error(f"The registry has no {task} pair.")
        return None
    default = registry.defaults.get(task)
    pairs.sort(key=lambda p: (p.name != default, p.name))
    labels = {p.name: f"{p.name}  ({availability(p)})" for p in pairs}
    name = st.selectbox("Pair", [p.name for p in pairs], format_func=labels.get, key="pair")
    pair = registry.get(name)
    if pair.description:
        st.caption(pair.description)
    return pair


def show_speed(tokens: int, seconds: float, main_calls: float, drafted: float, accepted: float,
               plain_seconds: float | None, identical: bool | None) -> None:
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
    from pipelines import metrics

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


# ----------------------------------------------------------------------------------------------------


def text_page(task: str) -> None:
    st.title(TITLES[task])
    pair = choose_pair(task)
    if pair is None:
        return
    src = tgt = None
    if task == "translate" and pair.languages:
        c1, c2 = st.columns(2)
        src = c1.selectbox("From", pair.languages, key="src")
        others = [x for x in pair.languages if x != src]
        tgt = c2.selectbox("To", others, key="tgt")
    text = st.text_area("Text", height=200, key="text",
                        help=f"Up to {MAX_INPUT_CHARS:,} characters; long texts are split or chunked.")
    compare = st.checkbox("Also decode plainly: measure the speedup and check the output is identical", key="compare")
    reference = st.text_area("Reference (optional): paste one to get a quality score", height=80, key="reference")
    if not st.button(TITLES[task], type="primary", key="run"):
        return
    if not text.strip():
        st.warning(f"Enter some text to {task}.")
        return
    if len(text) > MAX_INPUT_CHARS:
        st.error(f"The text has {len(text):,} characters; the limit is {MAX_INPUT_CHARS:,}.")
        return
    try:
        runner = text_runner(pair.name, models_file())
        fn = runner.translate if task == "translate" else runner.summarize
        result = fn(text, TextOptions(src=src, tgt=tgt, compare=compare))
    except ModelUnavailableError as exc:
        st.error(f"The pair {pair.name!r} cannot be loaded: {exc}")
        return
    except TextInputError as exc:
        st.error(str(exc))
        return
    for note in result.notes:
        st.info(note)
    st.text_area("Output", result.output, height=160, key="output", disabled=True)
    show_speed(result.tokens, result.seconds, result.main_calls, result.drafted, result.accepted,
               result.plain_seconds, result.identical)
    accepted_chart(result.accepted_hist)
    if reference.strip():
        quality(task, result.output, reference)


def sample_clips() -> dict[str, Path]:
    """Clips of the built speech-real set, if it is built (``tandem data build speech-real``)."""
    from pipelines.evalsets import read_manifest, set_dir

    try:
        items = read_manifest("speech-real")
    except Exception:
        return {}
    folder = set_dir("speech-real")
    return {it["id"]: folder / it["audio"] for it in items}


def transcribe_page() -> None:
    from pipelines.asr import TranscribeOptions, transcribe

    st.title("Transcribe")
    pair = choose_pair("asr")
    if pair is None:
        return
    upload = st.file_uploader(f"Audio or video file (up to {UPLOAD_LIMIT_MB} MB: {', '.join(AUDIO_TYPES)})",
                              type=AUDIO_TYPES, key="upload")
    samples = sample_clips()
    sample = st.selectbox("...or a sample clip", ["(none)"] + sorted(samples), key="sample") if samples else "(none)"
    language = st.selectbox("Language", ["en", "auto", "de", "fr", "es", "it", "pt", "ru", "nl"], key="language")
    compare = st.checkbox("Also decode plainly: measure the speedup and check the output is identical", key="compare")
    chunked = st.checkbox("Files over 30 s: cut at pauses and decode 4 chunks at a time (faster; the wording "
                          "may differ at the cuts from Whisper's window-by-window decoding)", key="chunked")
    with st.expander("Safeguards against invented text (Whisper's)"):
        fallback = st.checkbox("Decode again hotter when the text repeats itself or is unlikely (temperature "
                               "fallback 0.2 ... 1.0, assisted)", value=True, key="fallback")
        ratio = st.number_input("compression_ratio_threshold", value=2.4, min_value=0.1, step=0.1, key="cr_threshold")
        logprob = st.number_input("logprob_threshold", value=-1.0, step=0.1, key="lp_threshold")
        no_speech = st.number_input("no_speech_threshold", value=0.6, min_value=0.0, max_value=1.0, step=0.05,
                                    key="ns_threshold")
    reference = st.text_area("Reference (optional): paste one to get the WER", height=80, key="reference")
    if not st.button("Transcribe", type="primary", key="run"):
        return
    if upload is None and sample == "(none)":
        st.warning("Choose an audio file (or a sample clip) first.")
        return
    if upload is not None and upload.size > UPLOAD_LIMIT_MB * 1024 * 1024:
        st.error(f"The file has {upload.size / 2**20:.0f} MB; the limit is {UPLOAD_LIMIT_MB} MB.")
        return
    options = TranscribeOptions(language=None if language == "auto" else language, compare=compare,
                                batch_size=4 if chunked else 1, long_form="chunked" if chunked else "sequential",
                                temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0) if fallback else (0.0,),
                                compression_ratio_threshold=ratio, logprob_threshold=logprob, no_speech_threshold=no_speech)
    with tempfile.TemporaryDirectory() as tmp:
        if upload is not None:
            path = Path(tmp) / Path(upload.name).name
            path.write_bytes(upload.getvalue())
        else:
            path = samples[sample]
        try:
            runner = whisper_runner(pair.name, models_file())
            with st.spinner("Transcribing..."):
                result = next(transcribe([path], pair, options, runner=runner))
        except ModelUnavailableError as exc:
            st.error(f"The pair {pair.name!r} cannot be loaded: {exc}")
            return
        except AudioDecodeError as exc:
            st.error(f"This file cannot be read as audio: {exc.reason}")
            return
    if result.error:
        st.error(f"This file cannot be read as audio: {result.error}")
        return
    if not result.text:
        st.info("No speech was found in this file" + (f" ({result.skipped} window(s) skipped as silence, "
                f"{result.dropped} dropped as repetitive or unlikely)" if result.skipped or result.dropped else " (silence)."))
    elif result.retried:
        st.caption(f"{result.retried} window(s) were decoded again at a higher temperature (Whisper's fallback).")
    st.text_area("Transcript", result.text, height=140, key="output", disabled=True)
    st.caption(f"{result.duration:.1f} s of audio, language {result.language}, real-time factor "
               f"{result.seconds / result.duration:.3f}" if result.duration else "")
    if result.segments:
        st.dataframe([{"start": s.start, "end": s.end, "text": s.text, "avg_logprob": s.avg_logprob,
                       "no_speech_prob": s.no_speech_prob, "compression_ratio": s.compression_ratio,
                       "temperature": s.temperature} for s in result.segments], hide_index=True)
    show_speed(result.tokens, result.decode_seconds or result.seconds, result.main_calls, result.drafted,
               result.accepted, result.plain_seconds, result.identical)
    if reference.strip():
        quality("asr", result.text, reference)
