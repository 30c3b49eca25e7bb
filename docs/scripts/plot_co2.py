"""Regenerate docs/_static/co2-fit.png: the figure of ``gpchol fit`` on the CO2 data.

Runs the README's first command's fit (``gpchol fit``: the Rasmussen & Williams kernel on
the embedded monthly Mauna Loa CO2 record, n = 521) in a temporary folder, so the picture
in the README and on the Getting started page is exactly what a new user gets, and copies
its plot here. Usage, from the repository root::

    python docs/scripts/plot_co2.py
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tempfile

TARGET = pathlib.Path(__file__).resolve().parents[1] / "_static" / "co2-fit.png"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "gpchol.cli", "fit", "--quiet", "--no-cache"]
        subprocess.run(cmd, cwd=tmp, check=True)
        shutil.copyfile(pathlib.Path(tmp) / "gpchol-fit.png", TARGET)
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
