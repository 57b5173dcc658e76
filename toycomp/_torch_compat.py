"""The one place where toycomp touches private PyTorch APIs.

Everything imported here may change between PyTorch releases (toycomp runs on torch 2.13 in CI
and torch 2.11 on the GPU machine). Stages import these names from here, never from
``torch._*`` / ``torch.utils._*`` directly, so a PyTorch upgrade is fixed in one file.
"""

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401  (aot.py's recorder)
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten  # noqa: F401
from torch._C import _set_grad_enabled  # noqa: F401  (capture.py records grad-mode changes)
