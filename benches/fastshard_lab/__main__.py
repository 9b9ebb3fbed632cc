"""``python -m fastshard_lab [--preset NAME] [options]``: the benchmark lab's
presets (``--help`` lists them)."""

import sys

from .command import main

sys.exit(main())
