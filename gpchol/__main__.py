"""``python -m gpchol``: the same as the ``gpchol`` command (and ``python -m gpchol.cli``)."""

import sys

from gpchol.cli import main

if __name__ == "__main__":
    sys.exit(main())
