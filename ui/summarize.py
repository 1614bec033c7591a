"""The Summarize page's entry in the navigation. Its body is drawn by app.py (the main script), so that the values
typed into it travel with a change of page (see app.py)."""
