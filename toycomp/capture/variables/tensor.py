"""TensorVariable: a tensor while tracing, as an FX node plus a fake tensor with its metadata.

Every operation on a TensorVariable adds a node to the graph and runs the same operation on the
*fake* tensor (``FakeTensorMode``: shapes, strides, dtype, device, no data), so the interpreter
knows the result's metadata without computing anything. Metadata reads (``x.shape``, ``x.dim()``,
``x.dtype``) become Python constants, covered by the tensor's guards. Reads of the *data*
(``x.item()``, ``x.tolist()``, ``bool(x)``) cannot be known and break the graph.

Example (inside a trace): ``y = x.sin()`` adds ``sin = x.sin()`` to the graph and gives a
TensorVariable whose ``example`` is a FakeTensor of x's shape; ``y.shape[0]`` is a constant.

NB: in PyTorch this lives in torch/_dynamo/variables/tensor.py (TensorVariable; ``method_item``
breaks the graph unless ``capture_scalar_outputs``).
"""

from __future__ import annotations

import operator

import numpy as np
import torch
import torch.fx

from toycomp.capture.variables.base import (
    ConstantVariable,
    MethodVariable,
    MissingAttribute,
    Unsupported,
    VariableTracker,
)

# Tensor methods whose result is Python metadata: answered from the fake tensor, no node.
METADATA_METHODS = {"size", "dim", "ndimension", "numel", "stride", "is_contiguous",
                    "element_size", "nelement", "is_floating_point", "is_complex",
                    "get_device", "__len__"}
METADATA_ATTRS = {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_leaf",
                  "layout", "is_sparse", "is_quantized", "is_meta", "is_nested", "is_cpu",
                  "is_mps", "is_xpu", "is_mkldnn"}
GRAPH_ATTRS = {"T", "mT", "H", "mH", "real", "imag"}  # attributes that compute a tensor
# Methods that read data into Python: each is a graph break (the reason names it).
DATA_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                "data_ptr", "backward", "cpu_numpy", "__array__", "__format__", "__repr__",
                "__str__", "nonzero_static_python"}


class TensorVariable(VariableTracker):
    """A tensor: ``proxy`` is its FX node, ``example`` its fake tensor."""

    def __init__(self, proxy: torch.fx.Node, example: torch.Tensor, source=None, cls=torch.Tensor):
        self.proxy = proxy
        self.example = example
        self.source = source
        self.cls = cls  # torch.Tensor or torch.nn.Parameter: what isinstance sees

    def python_type(self) -> type:
        return self.cls

    def truth(self, tx) -> bool:
        raise Unsupported("jump on a tensor's value (if/while on a tensor: data-dependent)")

    def var_getattr(self, tx, name):
        if name in METADATA_ATTRS:
            value = getattr(self.example, name)
            return ConstantVariable(value)
        if name in GRAPH_ATTRS:
            return tx.output.create_call("call_function", getattr,
                                         [self, ConstantVariable(name)], {})
        if name in ("grad", "data", "_base", "grad_fn"):
            raise Unsupported(f"Tensor.{name} read while tracing")
        if callable(getattr(torch.Tensor, name, None)):
            return MethodVariable(self, name)
        if not hasattr(torch.Tensor, name) and self.cls in (torch.Tensor, torch.nn.Parameter):
            self.check_missing(tx, name)  # hasattr(x, "jax") is False, as in eager
        raise Unsupported(f"Tensor attribute {name!r}")

    def check_missing(self, tx, name: str) -> None:
        """Raise MissingAttribute when the tensor has no attribute ``name``: one made by the
        graph has none of its own; an input is checked, and guarded to stay without it."""
        real = next((v for s, v, _ in tx.output.inputs if s == self.source), None)
        if self.source is not None and (real is None or hasattr(real, name)):
            return
        if self.source is not None:
            tx.output.guards.add(f"not hasattr({self.source.name()}, {name!r})")
        raise MissingAttribute(f"Tensor has no attribute {name!r}")

    def call_method(self, tx, name, args, kwargs):
        if name == "numpy" and not args and not kwargs and not self.example.requires_grad \
                and self.example.device.type == "cpu":
            return NumpyArrayVariable(self)
        if name in DATA_METHODS:
            raise Unsupported(f"Tensor.{name}() reads the tensor's data into Python")
        if name in METADATA_METHODS:
            consts = [a.as_python_constant() for a in args]
            kw = {k: v.as_python_constant() for k, v in kwargs.items()}
            value = getattr(self.example, name)(*consts, **kw)
            return ConstantVariable(value)
        if name == "__getitem__":
            return tx.output.create_call("call_function", operator.getitem, [self, *args], {})
        if name == "__setitem__":
            tx.output.create_call("call_function", operator.setitem, [self, *args], {})
            return ConstantVariable(None)
        if name in ("__iter__",):
            raise Unsupported("Tensor.__iter__")
        return tx.output.create_call("call_method", name, [self, *args], kwargs)

    def unpack_var_sequence(self, tx):
        if self.example.dim() == 0:
            raise Unsupported("iterating over a 0-d tensor")
        return [
            tx.output.create_call("call_function", operator.getitem,
                                  [self, ConstantVariable(i)], {})
            for i in range(self.example.shape[0])
        ]

    def reconstruct(self, codegen):  # read again from outside, or an output of the graph
        return codegen.graph_output(self) if self.source is None else codegen.source(self.source)

    def __repr__(self):
        return f"TensorVariable({self.proxy.name}, {tuple(self.example.shape)})"


class NumpyArrayVariable(VariableTracker):
    """``t.numpy()``: the tensor's data as a NumPy array (sharing its memory). toycomp does not
    trace NumPy (Dynamo does, through ``torch._numpy``): the array may become a tensor again
    (``torch.from_numpy``), be returned, or live across a graph break, where it is
    ``t.numpy()`` once more; any other use is a graph break that names it."""

    def __init__(self, tensor: TensorVariable):
        self.tensor = tensor

    def python_type(self):
        return np.ndarray

    def var_getattr(self, tx, name):
        example = self.tensor.example
        if name in ("shape", "ndim", "size"):  # (sizes may be symbols: no np.empty here)
            return ConstantVariable({"shape": tuple(example.shape), "ndim": example.dim(),
                                     "size": example.numel()}[name])
        if callable(getattr(np.ndarray, name, None)):
            return MethodVariable(self, name)  # a break at the call, which can resume after it
        raise Unsupported(f"NumPy ndarray.{name} of a tensor's data (toycomp does not trace "
                          "NumPy; Dynamo does, through torch._numpy)")

    def call_method(self, tx, name, args, kwargs):
        raise Unsupported(f"NumPy ndarray.{name}() on a tensor's data (toycomp does not trace "
                          "NumPy; Dynamo does, through torch._numpy)")

    def reconstruct(self, codegen):
        return f"{codegen.reconstruct(self.tensor)}.numpy()"

    def __repr__(self):
        return f"NumpyArrayVariable({self.tensor})"
