"""Tandem's Streamlit app: ``tandem ui`` serves it on 127.0.0.1."""

import streamlit as st

st.set_page_config(page_title="Tandem", layout="centered")
page = st.navigation([
    st.Page("translate.py", title="Translate"),
    st.Page("summarize.py", title="Summarize"),
    st.Page("transcribe.py", title="Transcribe"),
])
# Typed inputs outlive a page change: a widget's value, assigned back as plain session state before the page
# runs, is not dropped with the widgets of the page left (Streamlit's documented way; persist_state alone lost
# text committed by the same click that changed the page).
for key in ("translate_text", "translate_reference", "summarize_text", "summarize_reference", "asr_reference"):
    if key in st.session_state:
        st.session_state[key] = st.session_state[key]
st.sidebar.caption("Assisted decoding: a small model drafts, the large one checks. Same output, faster.")
page.run()
