"""The captured graph and how to call it: the user's arguments -> guard checks -> ``gm``'s inputs.

Input -> output: what ``capture`` (toycomp/capture/tracer.py) recorded -> a ``CapturedGraph``, a
callable that checks a call's ``(*args, **kwargs)`` against the guards (toycomp/capture/guards.py,
compiled by toycomp/capture/guard_compiler.py), flattens them into the flat list of tensors ``gm``
takes (user tensors, then the current values of lifted tensors), runs ``gm`` and rebuilds the
structure ``fn`` returned from ``gm``'s flat tuple of outputs.

    >>> import torch
    >>> from toycomp.capture.tracer import capture
    >>> captured = capture(lambda x, n: {"y": x * n}, torch.ones(3), 2)
    >>> print(captured.check_guards(torch.ones(4), 2))    # the first guard that fails
    x.shape == (3,)
    >>> print(captured.check_guards(torch.ones(3), 2))    # every guard holds
    None
    >>> flat = captured.guarded_inputs((torch.ones(3), 2), {})  # gm's inputs (None: a guard failed)
    >>> captured.unflatten_outputs(captured.gm(*flat))
    {'y': tensor([2., 2., 2.])}

NB: in PyTorch this lives in torch/_dynamo/guards.py (``GuardManager.check`` / the compiled
``check_fn`` that ``CheckFunctionManager`` builds), torch/_dynamo/output_graph.py (the graph and
its lifted inputs, ``GraphArg``) and the bytecode Dynamo emits around the compiled graph
(torch/_dynamo/codegen.py), which flattens arguments and rebuilds outputs.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch
import torch.fx

from toycomp._torch_compat import tree_unflatten
from toycomp.capture import guards as G
from toycomp.capture.guard_compiler import compile_check
from toycomp.capture.side_effects import SideEffects
from toycomp.capture.source_lines import GraphBreak

__all__ = ["CapturedGraph", "ConstantOutput", "LiftedTensor"]


@dataclass
class LiftedTensor:
    """A tensor read by ``fn`` that is neither an input nor computed inside: a graph input."""

    name: str  # placeholder name, e.g. "fc1_weight" or "const_0"
    source: str  # where it is read from, e.g. "self.fc1.weight"
    fetch: Callable[[], torch.Tensor]  # reads its *current* value on every call


class ConstantOutput(NamedTuple):
    """A non-tensor leaf of ``fn``'s output (``output_leaves``), returned as it was traced."""

    value: Any


@dataclass
class CapturedGraph:
    """The result of ``capture``: an FX graph plus what is needed to call it safely."""

    fn: Callable
    gm: torch.fx.GraphModule | None
    guards: list[G.Guard]
    graph_break: GraphBreak | None = None
    example_inputs: list[torch.Tensor] = field(default_factory=list)
    lifted: list[LiftedTensor] = field(default_factory=list)
    example_outputs: Any = None  # what fn returned during capture (it ran eagerly once)
    signature: inspect.Signature | None = None
    state_readers: dict[str, Callable[[], Any]] = field(default_factory=dict)
    output_spec: Any = None
    output_leaves: list = field(default_factory=list)  # int: index into gm's outputs, else const
    side_effects: SideEffects | None = field(default=None, repr=False)  # what undo puts back

    def undo_side_effects(self) -> None:
        """Undo the capture run's in-place updates of input / lifted tensors and its RNG use.

        Raises:
            RuntimeError: if some tensor was updated in a way that could not be undone (then
                the update stays, and running the same call again applies it twice).
        """
        if self.side_effects is not None:
            self.side_effects.undo()
            missed, self.side_effects = self.side_effects.missed, None
            if missed:
                raise RuntimeError(f"capture could not undo in-place updates of {missed}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Check guards, run ``gm`` and rebuild the outputs (raises if a guard fails)."""
        if self.gm is None:
            raise RuntimeError(f"nothing to run, capture hit a {self.graph_break}")
        failed = self.check_guards(*args, **kwargs)
        if failed is not None:
            raise RuntimeError(f"guard failed: {failed}")
        return self.unflatten_outputs(self.gm(*self.flatten_inputs(*args, **kwargs)))

    # -- guards --------------------------------------------------------------------------------
    def check_guards(self, *args: Any, **kwargs: Any) -> G.Guard | None:
        """Return the first guard that fails for these arguments, or None when all pass."""
        values = self.current_values(args, kwargs)
        if values is None:
            return self.guards[0]  # the structure guard
        return G.first_failing(self.guards, values)

    def guarded_inputs(self, args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
        """``flatten_inputs`` if every guard holds, else None: what a cache lookup on every call
        wants (``toycomp.compile``). The compiled check answers the common case; a miss (or a
        call it does not handle, like keyword arguments) takes the general path."""
        if self.fast_check is not None:
            flat = self.fast_check(args, kwargs)
            if flat is not None:
                return flat
        values = self.current_values(args, kwargs)
        if values is None or G.first_failing(self.guards, values) is not None:
            return None
        return [values[name] for name in self.input_sources]

    @functools.cached_property
    def fast_check(self) -> Callable[[tuple, dict], list[torch.Tensor] | None] | None:
        """The guards compiled to one function (``guard_compiler.py``), or None if they need
        the general path (nested or keyword-only arguments, defaults)."""
        params = G.plain_parameter_names(self.signature) if self.signature else None
        return compile_check(self.guards, params, self.readers, self.input_sources)

    @functools.cached_property
    def readers(self) -> dict[str, Callable[[], Any]]:
        """Source -> reader for every guarded value that is not an argument: module flags and
        closed-over constants (``state_readers``), and lifted tensors."""
        return {**self.state_readers, **{lt.name: lt.fetch for lt in self.lifted}}

    def current_values(self, args: tuple, kwargs: dict) -> dict[str, Any] | None:
        """Every guard source's current value (None when the arguments don't even bind)."""
        try:
            leaves, structure = G.flatten_user_inputs(self.signature, args, kwargs)
        except TypeError:
            return None
        values = {G.STRUCTURE: structure, G.GRAD_MODE: torch.is_grad_enabled(), **dict(leaves)}
        for source, read in self.readers.items():
            try:
                values[source] = read()
            except (AttributeError, KeyError, ValueError):
                pass  # a missing source fails its guards
        return values

    # -- flattening ----------------------------------------------------------------------------
    def flatten_inputs(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        """The tensors to call ``gm`` with: user tensors, then current values of lifted ones."""
        leaves = G.flatten_user_inputs(self.signature, args, kwargs)[0]
        user = [v for _, v in leaves if isinstance(v, torch.Tensor)]
        return user + [lifted.fetch() for lifted in self.lifted]

    @functools.cached_property
    def input_sources(self) -> list[str]:
        """Guard sources of ``gm``'s placeholders, in order: user tensors (a tensor passed twice
        has an ``alias`` guard instead of metadata guards), then lifted tensors."""
        lifted = [lt.name for lt in self.lifted]
        user = [g.source for g in self.guards if g.kind in ("shape", "alias")]
        return [src for src in user if src not in lifted] + lifted

    def unflatten_outputs(self, flat: tuple | list) -> Any:
        """Rebuild the structure ``fn`` returned from ``gm``'s flat tuple of tensors."""
        leaves = [flat[x] if isinstance(x, int) else x.value for x in self.output_leaves]
        return tree_unflatten(leaves, self.output_spec)

    # -- printing ------------------------------------------------------------------------------
    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        if self.gm is None:
            return f"CapturedGraph({name}): {self.graph_break}"
        guards = "\n".join(f"  {g}" for g in self.guards)
        return f"CapturedGraph({name}):\n{self.gm.code.strip()}\n\nguards:\n{guards}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))
