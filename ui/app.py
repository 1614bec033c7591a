"""Tandem's Streamlit app: ``tandem ui`` serves it on 127.0.0.1.

The pages' bodies are drawn here, by the main script, after the navigation has run the (empty) page file.
Why: on a click in the sidebar the browser sends the new page's rerun with the values of the main script's
widgets only (it drops the page's elements first). Text typed into a page's box reaches the server through
the box's blur, a rerun of its own; when the two reruns are merged on the server the newer one wins and
the text was lost. Drawn by the main script, the boxes' values travel with the page change itself.
"""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

from text_view import text_page  # noqa: E402
from transcribe_view import transcribe_page  # noqa: E402

BODIES = {"Translate": lambda: text_page("translate"), "Summarize": lambda: text_page("summarize"),
          "Transcribe": transcribe_page}

st.set_page_config(page_title="Tandem", layout="centered")
page = st.navigation([
    st.Page("translate.py", title="Translate"),
    st.Page("summarize.py", title="Summarize"),
    st.Page("transcribe.py", title="Transcribe"),
])
# Typed inputs outlive a page change: a widget's value, assigned back as plain session state before the page
# runs, is not dropped with the widgets of the page left (Streamlit's documented way).
for key in ("translate_text", "translate_reference", "summarize_text", "summarize_reference", "asr_reference"):
    if key in st.session_state:
        st.session_state[key] = st.session_state[key]
st.sidebar.caption("Assisted decoding: a small model drafts, the large one checks. Same output, faster.")
page.run()
BODIES[page.title]()
