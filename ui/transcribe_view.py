"""The Transcribe page: a pair, an upload or a sample clip (choosing one clears the other and the reference,
so no input goes stale), the language (fixed to English for an English-only model), Whisper's safeguards;
then progress with a Stop button, and the results to take away: the transcript in a copyable area, txt, srt,
vtt and json downloads (the CLI's writers, ``pipelines.asr.outputs.render``), the segments with their times, the
speed that fits the pair, the accepted-drafts chart and the WER against a pasted reference."""

from __future__ import annotations

import math
import tempfile
from dataclasses import replace
from pathlib import Path

import streamlit as st

from views import (
    accepted_chart,
    choose_pair,
    compare_box,
    copyable,
    device,
    language_name,
    models_file,
    quality,
    report,
    show_speed,
    stopped,
    whisper_runner,
    working,
)

from pipelines.asr import Progress, TranscribeOptions, Transcript, transcribe
from pipelines.asr.outputs import render, timestamp
from pipelines.audio import AudioDecodeError
from pipelines.models.registry import Pair

UPLOAD_LIMIT_MB = 200  # also server.maxUploadSize in ui/.streamlit/config.toml
DOWNLOADS = ("txt", "srt", "vtt", "json")
MIME = {"txt": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt", "json": "application/json"}
NO_SAMPLE = "(none)"
RESULT = "asr_result"


def sample_clips() -> dict[str, Path]:
    """Clips of the built speech-real set, if it is built (``tandem data build speech-real``)."""
    from pipelines.quality.sets import read_manifest, set_dir

    try:
        items = read_manifest("speech-real")
    except Exception:  # noqa: BLE001  (no samples is a normal state)
        return {}
    folder = set_dir("speech-real")
    return {it["id"]: folder / it["audio"] for it in items}


@st.cache_data(show_spinner=False)
def english_only(pair_name: str, models: str | None) -> bool:
    """Whether the pair's model is an English-only Whisper (read from its config; weights are not loaded)."""
    from pipelines.models.convert import is_multilingual_vocab
    from pipelines.models.loading import ModelUnavailableError, load_config
    from pipelines.models.registry import load_registry

    try:
        config = load_config(load_registry(models).get(pair_name).main)
    except ModelUnavailableError:
        return False
    return not is_multilingual_vocab(config.vocab_size)


def _upload_key() -> str:
    return f"asr_upload_{st.session_state.setdefault('asr_upload_gen', 0)}"


def _on_upload() -> None:
    """A new file replaces the sample clip, the reference and the last result."""
    if st.session_state.get(_upload_key()) is not None:
        st.session_state["asr_sample"] = NO_SAMPLE
        st.session_state["asr_reference"] = ""
        st.session_state.pop(RESULT, None)


def _on_sample() -> None:
    """A sample clip replaces the upload (a new uploader key empties it), the reference and the last result."""
    if st.session_state.get("asr_sample", NO_SAMPLE) != NO_SAMPLE:
        st.session_state["asr_upload_gen"] = st.session_state.get("asr_upload_gen", 0) + 1
        st.session_state["asr_reference"] = ""
        st.session_state.pop(RESULT, None)


def choose_language(pair: Pair) -> str | None:
    """The language box by name: English, auto-detect or another of Whisper's languages; for an English-only
    model fixed to English (disabled). Returns a code, or None to detect per file."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    if english_only(pair.name, models_file()):
        st.selectbox("Language", ["en"], format_func=language_name, disabled=True, key="asr_language_en",
                     help="This model is English-only: no language token, no detection.")
        return "en"
    codes = ["en", "auto"] + sorted((c for c in LANGUAGES if c != "en"), key=language_name)
    code = st.selectbox("Language", codes, key="asr_language", persist_state="session",
                        format_func=lambda c: "Detect per file" if c == "auto" else language_name(c))
    return None if code == "auto" else code


def read_options(language: str | None, compare: bool) -> TranscribeOptions:
    chunked = st.checkbox("Files over 30 s: cut at pauses and decode 4 chunks at a time (faster; the wording "
                          "may differ at the cuts from Whisper's window-by-window decoding)", key="asr_chunked")
    words = st.checkbox("Word timestamps (each word's start, end and probability: in the json download, the "
                        "srt/vtt cues and a table below)", key="asr_words")
    with st.expander("Safeguards against invented text (Whisper's)"):
        fallback = st.checkbox("Decode again hotter when the text repeats itself or is unlikely (temperature "
                               "fallback 0.2 ... 1.0, assisted)", value=True, key="asr_fallback")
        ratio = st.number_input("compression_ratio_threshold", value=2.4, min_value=0.1, step=0.1, key="asr_cr")
        logprob = st.number_input("logprob_threshold", value=-1.0, step=0.1, key="asr_lp")
        no_speech = st.number_input("no_speech_threshold", value=0.6, min_value=0.0, max_value=1.0, step=0.05,
                                    key="asr_ns")
    # timestamps on, as the CLI turns them on for srt/vtt (the page offers both): a short clip's cues are then
    # Whisper's, not one cue spanning the clip, and every download equals `tandem transcribe -f all`'s
    return TranscribeOptions(language=language, compare=compare, batch_size=4 if chunked else 1, device=device(),
                             timestamps=True,
                             long_form="chunked" if chunked else "sequential",
                             temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0) if fallback else (0.0,),
                             compression_ratio_threshold=ratio, logprob_threshold=logprob, no_speech_threshold=no_speech,
                             word_timestamps=words)


def clock(seconds: float) -> str:
    """``seconds`` as M:SS, or H:MM:SS from an hour."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def time_left(seconds: float) -> str:
    """A wall time still to wait, rounded as a person says it: "about 40 s", "about 25 min", "about 1 h 5 min"."""
    if seconds < 60:
        return f"about {max(5, math.ceil(seconds / 5) * 5)} s"
    minutes = math.ceil(seconds / 60)
    return f"about {minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"about {minutes} min"


def progress_text(p: Progress) -> tuple[float, str]:
    """The bar's fraction (audio decoded over the audio the file declares) and its line: windows done of the
    windows expected, audio decoded of the whole, and the time left at the pace of the windows so far
    (``Progress.windows_expected``, ``Progress.seconds_left``)."""
    total = p.audio_total
    fraction = p.audio_done / total if total else 0.0
    expected = max(p.windows, p.windows_expected)
    done = p.audio_done >= total
    text = (f"window {p.windows} of {'' if done else 'about '}{expected}, {clock(p.audio_done)} of {clock(total)} "
            "of audio")
    left = p.seconds_left
    if not done and left is not None:
        text += f", {time_left(left)} left"
    return fraction, text


def run_transcription(pair: Pair, path: Path, options: TranscribeOptions) -> Transcript | None:
    """Transcribe one file with progress and a Stop button; None (the reason shown in one line) on failure."""
    try:
        runner = whisper_runner(pair.name, models_file())
        with working("asr", "Transcribing") as update:
            result = next(transcribe([path], pair, options, runner=runner,
                                     progress=lambda p: update(*progress_text(p))))
    except AudioDecodeError as exc:
        st.error(f"This file cannot be read as audio: {exc.reason}")
        return None
    except Exception as exc:  # noqa: BLE001  (one line on the page, the traceback in the log)
        report(exc, pair)
        return None
    if result.error:
        st.error(f"This file cannot be read as audio: {result.error}")
        return None
    return result


def show_downloads(result: Transcript, stem: str) -> None:
    """txt, srt, vtt and json of the transcript, written by the CLI's own writers."""
    cols = st.columns(len(DOWNLOADS))
    for col, fmt in zip(cols, DOWNLOADS):
        col.download_button(f"Download {fmt}", render(result, fmt), file_name=f"{stem}.{fmt}", mime=MIME[fmt],
                            key=f"asr_download_{fmt}", on_click="ignore")


def show_segments(result: Transcript) -> None:
    """The segments with their times (HH:MM:SS.mmm) and full text; Whisper's figures on request."""
    st.table([{"start": timestamp(s.start), "end": timestamp(s.end), "text": s.text} for s in result.segments])
    with st.expander("Safeguard figures per segment"):
        st.dataframe([{"start": timestamp(s.start), "avg_logprob": s.avg_logprob, "no_speech_prob": s.no_speech_prob,
                       "compression_ratio": s.compression_ratio, "temperature": s.temperature}
                      for s in result.segments], hide_index=True)
    if any(s.words for s in result.segments):
        with st.expander("Words"):
            st.dataframe([{"start": timestamp(w.start), "end": timestamp(w.end), "word": w.word.strip(),
                           "probability": round(w.probability, 3)} for s in result.segments for w in s.words],
                         hide_index=True)


def show_transcript(pair: Pair, result: Transcript, stem: str, reference: str) -> None:
    if not result.text:
        st.info("No speech was found in this file" + (f" ({result.skipped} window(s) skipped as silence, "
                f"{result.dropped} dropped as repetitive or unlikely)" if result.skipped or result.dropped else " (silence)."))
    elif result.retried:
        st.caption(f"{result.retried} window(s) were decoded again at a higher temperature (Whisper's fallback).")
    if result.finish_reason == "length":
        st.warning(f"Cut by the token limit: {result.cut} window(s) stopped before their end (finish_reason "
                   "length); the text of those windows is incomplete.")
    if result.damaged:
        st.warning(f"The audio file is {'truncated' if result.truncated else 'damaged'}: "
                   f"{'; '.join(result.decode_warnings)}. {result.seconds_recovered or 0:.1f} s of it were decoded "
                   "and transcribed.")
    if result.audio_track is not None or result.start_offset:
        st.caption(f"Read as: {result.audio_note} (the segment times count from the start of the file).")
    copyable("Transcript", result.text, key="asr_output", height=140)
    show_downloads(result, stem)
    if result.duration:
        st.caption(f"{timestamp(result.duration)} of audio, language {language_name(result.language or 'en')}, "
                   f"real-time factor {result.seconds / result.duration:.3f} on {device()}")
    if result.segments:
        show_segments(result)
    show_speed(pair, result.tokens, result.decode_seconds or result.seconds, result.main_calls, result.drafted,
               result.accepted, result.plain_seconds, result.identical)
    accepted_chart(result.accepted_hist)
    if reference.strip():
        quality("asr", result.text, reference)


def transcribe_page() -> None:
    st.title("Transcribe")
    pair = choose_pair("asr")
    if pair is None:
        return
    # any file, as the CLI takes a folder's files by content (.mov, .avi, .ts, .mka, ...): a file that is not
    # audio is refused by the audio layer with its reason, not by a list of suffixes
    upload = st.file_uploader(f"Audio or video file (any container the CLI reads; up to {UPLOAD_LIMIT_MB} MB)",
                              type=None, key=_upload_key(), on_change=_on_upload)
    samples = sample_clips()
    sample = NO_SAMPLE
    if samples:
        sample = st.selectbox("...or a sample clip", [NO_SAMPLE] + sorted(samples), key="asr_sample",
                              on_change=_on_sample, persist_state="session")
    language = choose_language(pair)
    compare = compare_box("asr", pair)
    options = read_options(language, compare)
    reference = st.text_area("Reference (optional): paste one to get the WER", height=80, key="asr_reference",
                             persist_state="session")
    if stopped("asr"):
        st.session_state.pop(RESULT, None)
    if st.button("Transcribe", type="primary", key="asr_run"):
        st.session_state.pop(RESULT, None)
        if upload is None and sample == NO_SAMPLE:
            st.warning("Choose an audio file (or a sample clip) first.")
        elif upload is not None and upload.size > UPLOAD_LIMIT_MB * 1024 * 1024:
            st.error(f"The file has {upload.size / 2**20:.0f} MB; the limit is {UPLOAD_LIMIT_MB} MB.")
        else:
            with tempfile.TemporaryDirectory() as tmp:
                if upload is not None:
                    path = Path(tmp) / Path(upload.name).name
                    path.write_bytes(upload.getvalue())
                else:
                    path = samples[sample]
                result = run_transcription(pair, path, options)
            if result is not None:
                named = replace(result, path=path.name)  # the json download names the file, not a temporary copy
                st.session_state[RESULT] = (pair.name, named, Path(path.name).stem)
    if RESULT in st.session_state and st.session_state[RESULT][0] == pair.name:
        _, result, stem = st.session_state[RESULT]
        show_transcript(pair, result, stem, reference)
