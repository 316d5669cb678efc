"""Re-make the pictures under docs/img/: ``npu-launch --help`` and two pages of the built site.

    python docs/screenshots.py            # needs Debian's chromium (apt-get install chromium)

``--help`` is run for real (this tree's ``launcher``), drawn as a terminal by rich's SVG export
with its group headings in bold, and photographed by headless Chromium, as are the site's
"Getting started" and "Troubleshooting" pages after an ``mkdocs build`` into a temporary folder.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
HELP_COLUMNS = 100
PAGES = {"page-getting-started.png": "getting-started/index.html",
         "page-troubleshooting.png": "troubleshooting/index.html"}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "COLUMNS": str(HELP_COLUMNS), "NO_MKDOCS_2_WARNING": "1"}


def help_text() -> str:
    """What ``npu-launch --help`` prints, from this tree."""
    return subprocess.run([sys.executable, "-m", "launcher.cli", "--help"], env=_env(), cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout


def help_svg(text: str) -> str:
    """The help as a terminal window, headings (lines ending in ':') in bold."""
    from rich.console import Console
    from rich.text import Text
    console = Console(record=True, width=HELP_COLUMNS, file=open(os.devnull, "w"))
    for line in text.splitlines():
        heading = bool(re.fullmatch(r"[A-Z][A-Za-z ]+:", line))
        console.print(Text(line, style="bold cyan" if heading else ""), highlight=False, soft_wrap=True)
    return console.export_svg(title="npu-launch --help")


def shoot(chromium: str, url: str, out: Path, width: int, height: int, profile: Path) -> None:
    """One headless Chromium screenshot of ``url``."""
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={out}",
                    f"--window-size={width},{height}", url],
                   check=True, capture_output=True, timeout=120)


def svg_size(svg: str) -> tuple[int, int]:
    match = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg)
    assert match, "rich's SVG has a viewBox"
    return int(float(match.group(1))) + 1, int(float(match.group(2))) + 1


def main() -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("docs/screenshots.py: no chromium on PATH (apt-get install chromium)")
    IMG.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        svg = help_svg(help_text())
        (work / "help.svg").write_text(svg)
        width, height = svg_size(svg)
        shoot(chromium, (work / "help.svg").as_uri(), IMG / "help.png", width, height, work / "p1")
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--site-dir", str(work / "site")],
                       cwd=ROOT, env=_env(), check=True, capture_output=True)
        for name, page in PAGES.items():
            shoot(chromium, (work / "site" / page).as_uri(), IMG / name, 1280, 900, work / "p2")
    print(f"wrote {', '.join(['help.png', *PAGES])} in {IMG}")


if __name__ == "__main__":
    main()
