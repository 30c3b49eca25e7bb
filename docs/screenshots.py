"""Screenshots of the built site in headless Chromium, to look at what a reader sees.

Opens the landing page, one executed notebook page and one API reference page of
``docs/_build/html`` (build it first, see ``docs/conf.py``) from the file system, with no
network, and saves a PNG of each to ``docs/_build/screenshots/``. Needs Chromium (Debian:
``apt-get install chromium``). Usage, from the repository root::

    python docs/screenshots.py [--html docs/_build/html] [--out docs/_build/screenshots]

Chromium is started with its network off (``--proxy-server`` pointing nowhere and every
host mapped to an unroutable address), so an equation that renders in the screenshots was
rendered by the MathJax copy inside the site, and a figure that shows was loaded from it.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile

DOCS = pathlib.Path(__file__).resolve().parent
PAGES = {
    "landing": ("index.html", 1800),
    "notebook": ("notebooks/01_quickstart.html", 3200),
    "api": ("api/gpchol.html", 2400),
    "design": ("design.html", 2600),
}


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("no Chromium found: install Debian's `chromium` package (apt-get install chromium)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=pathlib.Path, default=DOCS / "_build" / "html")
    parser.add_argument("--out", type=pathlib.Path, default=DOCS / "_build" / "screenshots")
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args()
    chromium = find_chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (page, height) in PAGES.items():
        path = (args.html / page).resolve()
        if not path.is_file():
            sys.exit(f"{path} does not exist: build the site first")
        target = args.out / f"{name}.png"
        with tempfile.TemporaryDirectory() as profile:
            cmd = [
                chromium,
                "--headless",
                "--no-sandbox",  # running as root in a container
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                "--proxy-server=127.0.0.1:9",  # no network: nothing can come from a CDN
                "--host-resolver-rules=MAP * 0.0.0.0",
                "--virtual-time-budget=15000",  # let MathJax typeset before the shot
                f"--window-size={args.width},{height}",
                f"--screenshot={target}",
                path.as_uri(),
            ]
            subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        print(f"{page} -> {target}")


if __name__ == "__main__":
    main()
