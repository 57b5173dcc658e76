"""toycomp: PyTorch 2's compiler stack (torch.compile) rebuilt small enough to read.

    fn --capture--> torch-level FX graph + guards            toycomp/capture.py
       --aot------> joint / forward / backward ATen graphs   toycomp/aot.py
       --prims----> graphs of ~40 primitives                 toycomp/prims.py, decompositions.py
       --inductor-> loop IR -> fused C++ / Triton kernels    toycomp/inductor/

Public API: ``toycomp.compile(fn, backend=None)``, ``toycomp.explain(fn, *inputs)``,
``toycomp.capture(fn, *inputs)``, ``toycomp.viz.draw(gm)``, and
``torch.compile(fn, backend="toycomp")`` once the package is installed.
"""

import importlib
from typing import Any

# Imported eagerly: the function shares its name with its module (toycomp/capture.py), and
# binding it here, after the module has loaded, keeps `toycomp.capture` the function for good.
from toycomp.capture import capture

__all__ = ["Explanation", "capture", "compile", "explain", "toycomp_backend", "viz"]
__version__ = "0.1.0"

# Public name -> the module that defines it. Imported on first use, so that `import toycomp`
# stays cheap and a stage module can be imported (and tested) on its own.
_PUBLIC = {
    "compile": "toycomp.pipeline",
    "toycomp_backend": "toycomp.pipeline",
    "explain": "toycomp.explanation",
    "Explanation": "toycomp.explanation",
}


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    if name == "viz":
        return importlib.import_module("toycomp.viz")
    raise AttributeError(f"module 'toycomp' has no attribute {name!r}")
