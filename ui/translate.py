"""The Translate page."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from text_view import text_page  # noqa: E402

text_page("translate")
