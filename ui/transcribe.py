"""The Transcribe page."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from transcribe_view import transcribe_page  # noqa: E402

transcribe_page()
