"""Undoing what capture's one eager run did: ATen ops of ``fn`` -> snapshots to restore.

capture() runs ``fn`` for real on the example inputs, so its in-place updates of inputs,
parameters and buffers happen and random numbers are drawn. ``SideEffects`` remembers enough to
put those back, so that the caller can run the captured graph (or ``fn`` eagerly, after a graph
break) for the same call without applying them twice:

    >>> x = torch.zeros(2)
    >>> effects = SideEffects()
    >>> effects.watch("x", x)           # x is a graph input: its storage may be restored
    >>> effects.start()                 # saves the RNG state
    >>> with CreationTracker(effects):  # sees every ATen op; before_write(x) before x.add_
    ...     _ = x.add_(1)
    ...     r = torch.rand(3)
    >>> effects.finish()
    >>> effects.undo()                  # x and the RNG state are as before the run
    >>> x, torch.equal(torch.rand(3), r)
    (tensor([0., 0.]), True)

``CreationTracker`` is the ``TorchDispatchMode`` under the tracer's ``TorchFunctionMode``: besides
announcing writes it remembers which tensors ATen made during the run (see its Note).

NB: in PyTorch, Dynamo never runs ``fn`` while capturing (it traces with fake tensors), so it has
nothing to undo; it *records* mutations instead and replays them after the graph runs:
torch/_dynamo/side_effects.py (``SideEffects``: Python object and attribute mutations), and
in-place tensor updates stay in the graph for AOTAutograd's functionalization to handle.
"""

from __future__ import annotations

import weakref

import torch

from toycomp._torch_compat import TorchDispatchMode, tensor_version, tree_flatten
from toycomp._torch_compat import written_tensor_args


class SideEffects:
    """Remembers how to undo what the capture run did to tensors that outlive it.

    [Note: side effects of the capture run]
    capture() runs ``fn`` for real, so in-place updates of inputs, parameters and buffers (a
    BatchNorm's running stats) happen, and random numbers are drawn. If the caller then runs the
    graph for that same call (or ``fn`` eagerly after a graph break), they would happen twice.
    So before the first write to an input or lifted tensor (seen at the ATen level, from the op's
    schema) its storage is copied, and the RNG state is saved when ``fn`` starts; ``undo()``
    puts both back. Python side effects (appending to a list) cannot be undone.
    """

    def __init__(self):
        self.storages: dict[int, torch.UntypedStorage] = {}  # of inputs and lifted tensors
        self.snapshots: dict[int, torch.UntypedStorage] = {}  # their contents before a write
        self.versions: list[tuple[str, torch.Tensor, int]] = []  # (name, tensor, version)
        self.missed: list[str] = []  # tensors written in a way the schema did not announce
        self.rng: list[torch.Tensor] = []

    def watch(self, name: str, t: torch.Tensor) -> None:
        """Note a tensor that outlives the run (a graph input or lifted tensor) by its name."""
        self.versions.append((name, t, tensor_version(t)))
        self.storages.setdefault(storage_ptr(t), t.untyped_storage())

    def start(self) -> None:
        """Called when ``fn`` starts: save the RNG state(s)."""
        self.rng = [torch.get_rng_state()]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.rng += torch.cuda.get_rng_state_all()

    def before_write(self, t: torch.Tensor) -> None:
        """Called before an ATen op writes ``t``: snapshot its storage the first time."""
        ptr = storage_ptr(t)
        if ptr in self.storages and ptr not in self.snapshots:
            self.snapshots[ptr] = self.storages[ptr].clone()

    def finish(self) -> None:
        """Called when ``fn`` returns: note unannounced writes, drop what undo() does not need."""
        self.missed = [
            name
            for name, t, version in self.versions
            if tensor_version(t) != version and storage_ptr(t) not in self.snapshots
        ]
        self.storages = {ptr: self.storages[ptr] for ptr in self.snapshots}
        self.versions = []

    def undo(self) -> None:
        """Restore written inputs / lifted tensors and the RNG state; usable once."""
        for ptr, saved in self.snapshots.items():
            self.storages[ptr].copy_(saved)
        if self.rng:
            torch.set_rng_state(self.rng[0])
        if len(self.rng) > 1:
            torch.cuda.set_rng_state_all(self.rng[1:])
        self.storages, self.snapshots, self.rng = {}, {}, []


class CreationTracker(TorchDispatchMode):
    """Remembers every tensor produced by an ATen op while tracing.

    [Note: tensors the tracer did not see]
    A tensor that reaches a torch call without being a known node is normally a constant from
    outside (a global, a closure) and is lifted to a graph input. But a tensor can also be made
    inside ``fn`` by something the TorchFunctionMode does not intercept
    (``autograd.Function.apply``, ``nn.Parameter(...)``). Lifting it would silently freeze one
    run's value into the graph; so if the dispatcher saw it being created during tracing, or it
    shares memory with a tensor that a graph node computed (``nn.Parameter(y)`` wraps ``y``'s
    storage without any ATen op), the tracer breaks instead.
    """

    def __init__(self, side_effects: SideEffects):
        super().__init__()
        self.created: dict[int, weakref.ref] = {}
        self.side_effects = side_effects

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in written_tensor_args(func, args, kwargs or {}):
            self.side_effects.before_write(t)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.created[id(t)] = weakref.ref(t)
        return out

    def made(self, t: torch.Tensor) -> bool:
        """True when an ATen op produced ``t`` during this run."""
        ref = self.created.get(id(t))
        return ref is not None and ref() is t


def storage_ptr(t: torch.Tensor) -> int:
    """The address of ``t``'s storage (0 for layouts without one): a key for shared memory."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return 0
