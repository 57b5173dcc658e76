"""Builds the course website: ``python site/build.py [--out DIR]`` (``./dev.sh site`` runs it).

Input -> output: the committed, executed student notebooks, the instructors' guide and the public
API's docstrings -> a static HTML folder (default ``site/_build/html``) that any static host
serves, GitHub Pages included. Nothing is executed: the pages show the outputs stored in the
notebooks, the same ones nbval checks. Students see the student notebooks, so an exercise shows
its stub and its checker, never its solution.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

SITE = Path(__file__).resolve().parent
ROOT = SITE.parent
PAGES = ["conf.py", "index.md", "api.md"]


def stage(src: Path) -> None:
    """Lays out the Sphinx source folder: the site's own pages, the student notebooks, and the
    instructors' guide (notebooks/README.md)."""
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    for name in PAGES:
        shutil.copy(SITE / name, src / name)
    shutil.copytree(SITE / "_static", src / "_static")
    for notebook in sorted((ROOT / "notebooks").glob("0*.ipynb")):
        shutil.copy(notebook, src / notebook.name)
    shutil.copy(ROOT / "notebooks" / "README.md", src / "instructors.md")


def build(out: Path) -> int:
    src = SITE / "_build" / "src"
    stage(src)
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", "auto",
           "-d", str(SITE / "_build" / "doctrees"), str(src), str(out)]  # fmt: skip
    rc = subprocess.call(cmd, cwd=ROOT)
    if rc == 0:
        # GitHub Pages: serve the folder as it is (no Jekyll processing of _static/).
        (out / ".nojekyll").touch()
        print(f"[site] built {out / 'index.html'}")
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SITE / "_build" / "html")
    return build(parser.parse_args(argv).out)


if __name__ == "__main__":
    sys.exit(main())
