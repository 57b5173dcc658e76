"""What every real-model test shares: transformers is needed, and its warnings are quiet."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def quiet_transformers():
    transformers = pytest.importorskip("transformers")
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(level)
