"""Logs while your own code runs: ``TOYCOMP_LOGS`` and ``toycomp.set_logs``, as ``TORCH_LOGS``.

Each kind of message is an *artifact* with its own logger under Python's ``toycomp`` logger
(``toycomp.graph_breaks``...), named as ``TORCH_LOGS`` names the same thing:

    graph_breaks  each graph break: its reason and the user's source line
    recompiles    each recompile of a function, with the guard that failed
    guards        the guards of each compiled entry
    graph_code    each captured torch-level graph, as Python
    aot_graphs    the forward and backward ATen graphs AOT made of it
    output_code   the generated kernels and the wrapper that calls them
    fallbacks     ops that run as calls to eager PyTorch (toycomp's own)

Turn them on with the environment (``TOYCOMP_LOGS=graph_breaks,recompiles python train.py``)
or from Python (``toycomp.set_logs(graph_breaks=True)``); ``toycomp.set_logs()`` turns all off.
Messages go to stderr through a handler on the ``toycomp`` logger, added when logs are first
turned on unless the program gave that logger a handler of its own (a notebook's, a file's).

NB: in PyTorch this lives in torch/_logging/ (``set_logs``, ``getArtifactLogger``, the
``TORCH_LOGS`` parser in _internal.py and the registrations in _registrations.py).
"""

from __future__ import annotations

import logging
import os
import sys

ARTIFACTS = ("graph_breaks", "recompiles", "guards", "graph_code", "aot_graphs",
             "output_code", "fallbacks")
OFF = logging.CRITICAL + 1  # an artifact logger's level while it is not asked for

root = logging.getLogger("toycomp")
_LOGGERS = {name: logging.getLogger(f"toycomp.{name}") for name in ARTIFACTS}


def getArtifactLogger(name: str) -> logging.Logger:  # noqa: N802 (torch._logging's name)
    """The logger of one artifact (``toycomp.graph_breaks``...)."""
    if name not in ARTIFACTS:
        raise ValueError(f"toycomp: unknown log {name!r}; choose among {', '.join(ARTIFACTS)}")
    return _LOGGERS[name]


def log_enabled(name: str) -> bool:
    """Is ``name`` on? (Cheap: callers test it before building a message.)"""
    return _LOGGERS[name].isEnabledFor(logging.DEBUG)


def log(name: str, message: str, *args) -> None:
    getArtifactLogger(name).debug(message, *args)


def set_logs(**artifacts: bool) -> None:
    """Turn artifacts on (``set_logs(graph_breaks=True, guards=True)``); the others go off.

    Raises:
        ValueError: an unknown artifact name (the message lists the known ones).
    """
    for name in artifacts:
        getArtifactLogger(name)  # (checks the name)
    for name in ARTIFACTS:
        getArtifactLogger(name).setLevel(logging.DEBUG if artifacts.get(name) else OFF)
    if any(artifacts.values()) and not root.handlers:  # (unless the program added its own)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        root.addHandler(handler)


def parse(text: str) -> dict[str, bool]:
    """``"graph_breaks,recompiles"`` (commas or spaces; ``all``) -> ``set_logs`` arguments."""
    names = [n.strip().lstrip("+") for n in text.replace(" ", ",").split(",") if n.strip()]
    if "all" in names:
        return dict.fromkeys(ARTIFACTS, True)
    unknown = [n for n in names if n not in ARTIFACTS]
    if unknown:
        raise ValueError(f"TOYCOMP_LOGS: unknown log(s) {', '.join(unknown)}; choose among "
                         f"{', '.join(ARTIFACTS)} (or all)")
    return dict.fromkeys(names, True)


def init_from_env() -> None:
    """Read ``TOYCOMP_LOGS`` once, when toycomp is imported."""
    set_logs(**parse(os.environ.get("TOYCOMP_LOGS", "")))
