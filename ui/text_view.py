"""The Translate and Summarize pages: a pair, the text (kept across page changes), a Run button, then the
output in a copyable area with a txt download, the speed that fits the pair, the accepted-drafts chart and a
quality score against a pasted reference. The last result stays on the page until the next run."""

from __future__ import annotations

import streamlit as st

from views import (
    TITLES,
    accepted_chart,
    choose_pair,
    compare_box,
    copyable,
    language_name,
    models_file,
    quality,
    report,
    show_speed,
    stopped,
    text_runner,
    working,
)

from pipelines.models.registry import Pair
from pipelines.text import MAX_INPUT_CHARS, TextInputError, TextOptions, TextResult


def choose_languages(pair: Pair) -> tuple[str | None, str | None]:
    """From and To selectors (by name) for a pair with languages; (None, None) for one without."""
    if not pair.languages:
        return None, None
    c1, c2 = st.columns(2)
    src = c1.selectbox("From", pair.languages, format_func=language_name, key="translate_src", persist_state="session")
    others = [x for x in pair.languages if x != src]
    tgt = c2.selectbox("To", others, format_func=language_name, key="translate_tgt", persist_state="session")
    return src, tgt


def run_text(task: str, pair: Pair, text: str, options: TextOptions) -> TextResult | None:
    """Decode with progress and a Stop button; None (the reason shown in one line) when it fails."""
    try:
        runner = text_runner(pair.name, models_file())
        fn = runner.translate if task == "translate" else runner.summarize
        unit = "sentences" if task == "translate" else "chunks"
        with working(task, {"translate": "Translating", "summarize": "Summarizing"}[task]) as update:
            return fn(text, options, progress=lambda done, total: update(done / total, f"{done} of {total} {unit}"))
    except TextInputError as exc:
        st.error(str(exc))
    except Exception as exc:  # noqa: BLE001  (one line on the page, the traceback in the log)
        report(exc, pair)
    return None


def show_text_result(task: str, pair: Pair, result: TextResult, reference: str) -> None:
    for note in result.notes:
        st.info(note)
    copyable("Output", result.output, key=f"{task}_output")
    st.download_button("Download txt", result.output + "\n", file_name=f"{task}.txt", mime="text/plain",
                       key=f"{task}_download_txt", on_click="ignore")
    show_speed(pair, result.tokens, result.seconds, result.main_calls, result.drafted, result.accepted,
               result.plain_seconds, result.identical)
    accepted_chart(result.accepted_hist)
    if reference.strip():
        quality(task, result.output, reference)


def text_page(task: str) -> None:
    st.title(TITLES[task])
    pair = choose_pair(task)
    if pair is None:
        return
    src, tgt = choose_languages(pair) if task == "translate" else (None, None)
    text = st.text_area("Text", height=200, key=f"{task}_text", persist_state="session",
                        help=f"Up to {MAX_INPUT_CHARS:,} characters; long texts are split or chunked.")
    compare = compare_box(task, pair)
    reference = st.text_area("Reference (optional): paste one to get a quality score", height=80,
                             key=f"{task}_reference", persist_state="session")
    kept = f"{task}_result"
    if stopped(task):
        st.session_state.pop(kept, None)
    if st.button(TITLES[task], type="primary", key=f"{task}_run"):
        st.session_state.pop(kept, None)
        if not text.strip():
            st.warning(f"Enter some text to {task}.")
        elif len(text) > MAX_INPUT_CHARS:
            st.error(f"The text has {len(text):,} characters; the limit is {MAX_INPUT_CHARS:,}.")
        else:
            result = run_text(task, pair, text, TextOptions(src=src, tgt=tgt, compare=compare))
            if result is not None:
                st.session_state[kept] = (pair.name, result)
    if kept in st.session_state and st.session_state[kept][0] == pair.name:
        show_text_result(task, pair, st.session_state[kept][1], reference)
