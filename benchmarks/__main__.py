"""``python -m benchmarks``: the whole suite (see :mod:`benchmarks.run`)."""

import sys

from .run import main

sys.exit(main())
