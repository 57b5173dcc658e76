"""The one place where toycomp touches private PyTorch APIs.

Everything imported here may change between PyTorch releases (toycomp runs on torch 2.13 in CI
and torch 2.11 on the GPU machine). Stages import these names from here, never from
``torch._*`` / ``torch.utils._*`` directly, so a PyTorch upgrade is fixed in one file.
"""

import contextlib
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401  (functionalize.py's recorder)
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten  # noqa: F401
from torch._C import _set_grad_enabled  # noqa: F401  (capture.py records grad-mode changes)
from torch._ops import OpOverload  # noqa: F401  (decompositions.py: is this target an ATen op?)


# Ops that update their running stats in place although their schema does not say so.
_UNANNOTATED_WRITES = {
    f"aten::{name}": ("running_mean", "running_var")
    for name in ("native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm")
}


def written_tensor_args(func, args, kwargs):  # capture.py: which tensors does an ATen op mutate?
    """Tensor arguments that an OpOverload's schema marks as written (``Tensor(a!)``)."""
    written = []
    unannotated = _UNANNOTATED_WRITES.get(func._schema.name, ())
    for i, arg in enumerate(func._schema.arguments):
        if arg.name in unannotated or (arg.alias_info is not None and arg.alias_info.is_write):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            written += [v for v in values if hasattr(v, "untyped_storage")]
    return written


def tensor_version(t):  # capture.py: a tensor's in-place version counter
    return t._version


@contextlib.contextmanager
def cudnn_and_mkldnn_disabled() -> Iterator[None]:
    """Turn cudnn and mkldnn (oneDNN) off for a while (aot.py records native ATen ops).

    Through torch._C rather than ``torch.backends.*.enabled = False``: that assignment raises
    once PyTorch's test utilities have frozen the global flags, and the ``flags()`` context
    managers also reset TF32 and determinism settings.
    """
    was = torch._C._get_cudnn_enabled(), torch._C._get_mkldnn_enabled()
    torch._C._set_cudnn_enabled(False)
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_cudnn_enabled(was[0])
        torch._C._set_mkldnn_enabled(was[1])
