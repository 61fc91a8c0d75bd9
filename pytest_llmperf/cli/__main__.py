"""``python -m pytest_llmperf.cli``: the ``llmperf`` command."""

import sys

from . import main

sys.exit(main())
