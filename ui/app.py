"""Tandem's Streamlit app: ``tandem ui`` serves it on 127.0.0.1."""

import streamlit as st

st.set_page_config(page_title="Tandem", layout="centered")
page = st.navigation([
    st.Page("translate.py", title="Translate"),
    st.Page("summarize.py", title="Summarize"),
    st.Page("transcribe.py", title="Transcribe"),
])
st.sidebar.caption("Assisted decoding: a small model drafts, the large one checks. Same output, faster.")
page.run()
