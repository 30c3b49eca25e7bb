"""``python -m gpchol.cli``: the same as the ``gpchol`` command."""

import sys

from gpchol.cli import main

if __name__ == "__main__":
    sys.exit(main())
