"""``python -m pipelines.cli``: the ``tandem`` command."""

import sys

from . import main

sys.exit(main())
