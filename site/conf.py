"""Sphinx configuration of the course website (``./dev.sh site``).

The pages are the committed, executed student notebooks (never re-executed: ``nb_execution_mode =
"off"``), the instructors' guide and an API reference read from the public functions' docstrings.
``site/build.py`` copies them next to this file in ``site/_build/src`` and runs Sphinx there.
"""

project = "toycomp"
author = "the toycomp authors"
copyright = "toycomp"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.graphviz"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

# The notebooks are executed once, by their authors, and committed with their outputs.
nb_execution_mode = "off"
# Graph drawings are SVG, plots PNG; a checker's verdict carries a JSON record next to its text.
nb_mime_priority_overrides = [("html", "application/vnd.toycomp.verdict+json", None)]
myst_enable_extensions = ["colon_fence"]
suppress_warnings = ["mystnb.unknown_mime_type"]

graphviz_output_format = "svg"
autodoc_member_order = "bysource"
autodoc_typehints = "description"

html_theme = "sphinx_book_theme"
html_title = "toycomp: torch.compile, rebuilt small"
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": True,
    "home_page_in_toc": True,
}
html_static_path = ["_static"]
html_favicon = "_static/favicon.svg"
# The theme reads the reader's light/dark choice from the browser; a first visit has none.
html_context = {"default_mode": "light"}
