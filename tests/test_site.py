"""The website's browser check finds what a student would see broken (site/check.py).

Runs only where Chromium, its driver and the site's packages are installed (``./dev.sh site
--check`` installs them); ``.ci/run`` builds and checks the real site with that command.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")
         and importlib.util.find_spec("selenium")),
    reason="needs chromium, chromium-driver and selenium (./dev.sh site --check installs them)",
)  # fmt: skip


@pytest.fixture(scope="module")
def check():
    sys.path.insert(0, str(ROOT / "site"))
    try:
        import check as module
    finally:
        sys.path.pop(0)
    return module


PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d4944415478da63f8ffff3f0005fe02fea7d6a4d80000000049454e44ae426082"
)


def write_site(html: Path, body: str) -> None:
    html.mkdir(parents=True, exist_ok=True)
    (html / "pic.png").write_bytes(PNG)
    head = '<head><link rel="icon" href="pic.png"></head>'
    (html / "other.html").write_text(f'<html>{head}<body><main><h1 id="top">o</h1></main></body></html>')
    (html / "index.html").write_text(f"<html>{head}<body><main>{body}</main></body></html>")


def test_a_sound_page_passes(check, tmp_path):
    write_site(tmp_path, '<a href="other.html#top">x</a><img src="pic.png">')
    assert check.check(tmp_path, tmp_path / 'shots') == []


@pytest.mark.parametrize("body, problem", [
    ('<a href="missing.html">x</a>', "broken link"),
    ('<a href="other.html#nowhere">x</a>', "no #nowhere"),
    ('<img src="missing.png">', "image did not load"),
    ("<script>throw new Error('boom')</script>", "console"),
    # what a page cut off halfway looks like: an id of the file that the DOM does not hold
    ('<p id="gone">x</p><script>document.getElementById("gone").remove()</script>',
     "the page loaded without 1 of its ids, 3 times (first: gone)"),
])  # fmt: skip
def test_each_kind_of_breakage_is_reported(check, tmp_path, body, problem):
    write_site(tmp_path, body)
    problems = check.check(tmp_path, tmp_path / 'shots')
    assert any(problem in p for p in problems), problems


def test_a_notebook_page_must_show_every_drawing(check, tmp_path, monkeypatch):
    write_site(tmp_path, '<div class="cell_output"><img src="pic.png" width="0"></div>')
    (tmp_path / "index.html").rename(tmp_path / "nb.html")
    monkeypatch.setattr(check, "notebook_drawings", lambda page: 2 if page.stem == "nb" else 0)
    problems = check.check(tmp_path, tmp_path / 'shots')
    assert any("0 drawings shown of the notebook's 2" in p for p in problems), problems
