"""toycomp: PyTorch 2's compiler stack (torch.compile) rebuilt small enough to read.

    fn --capture--> torch-level FX graphs + guards + resume functions   toycomp/capture/
       --aot------> joint / forward / backward ATen graphs   toycomp/aot/
       --prims----> graphs of ~40 primitives                 toycomp/prims/
       --inductor-> loop IR -> fused C++ / Triton kernels    toycomp/inductor/

Public API: ``toycomp.compile(fn, backend=None, dynamic=None, mode=None, options=None)``,
``toycomp.config`` (one flag per optimisation; presets ``teach`` and ``fast``), ``toycomp.explain(fn,
*inputs)``, ``toycomp.mark_dynamic(tensor, dim)``, ``toycomp.viz.draw(gm)``,
``toycomp.set_logs(graph_breaks=True, ...)`` (or ``TOYCOMP_LOGS=graph_breaks,...``: see
toycomp/_logging.py), and ``torch.compile(fn, backend="toycomp")`` once the package is
installed. Each stage's own entry point lives in its package
(``toycomp.capture.captured_graph.capture_graph``, ``toycomp.aot.aot_autograd.aot_function``,
``toycomp.prims.decompositions.decompose``, ``toycomp.inductor.lowering.lower``...).
"""

# Imported eagerly: `explain` shares its name with its module (toycomp/explain.py), and binding
# the function here, after the module has loaded, keeps `toycomp.explain` the function for good.
from toycomp import _logging, config, viz
from toycomp._logging import set_logs
from toycomp.capture.dynamic_shapes import mark_dynamic
from toycomp.explain import Explanation, explain
from toycomp.pipeline import compile, toycomp_backend

__all__ = ["Explanation", "compile", "config", "explain", "mark_dynamic", "set_logs",
           "toycomp_backend", "viz"]
_logging.init_from_env()
__version__ = "0.1.0"
