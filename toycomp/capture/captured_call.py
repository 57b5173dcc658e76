"""Calling a captured graph: the user's arguments -> guard checks -> ``gm``'s flat tensor inputs.

Input -> output: the ``(*args, **kwargs)`` of a call to a ``CapturedGraph`` -> the first failing
guard, or the flat list of tensors ``gm`` takes (user tensors, then the current values of lifted
tensors); and ``gm``'s flat tuple of outputs -> the structure ``fn`` returned. ``GuardedCall`` is
the part of ``CapturedGraph`` (toycomp/capture.py) that does this on every call; the guards
themselves are built by toycomp/guards.py and compiled by toycomp/guard_compiler.py.

Tiny example::

    captured = capture(lambda x, n: {"y": x * n}, torch.randn(3), 2)
    x = torch.randn(3)
    captured.check_guards(torch.randn(4), 2)   # the failing guard: x.shape == (3,)
    captured.check_guards(x, 2)                # None: every guard holds
    flat = captured.guarded_inputs((x, 2), {})  # [x]: gm's inputs (None if a guard fails)
    captured.unflatten_outputs(captured.gm(*flat))  # {"y": x * 2}

NB: in PyTorch this lives in torch/_dynamo/guards.py (``GuardManager.check`` / the compiled
``check_fn`` that ``CheckFunctionManager`` builds) and in the bytecode Dynamo emits around the
compiled graph (torch/_dynamo/codegen.py), which flattens arguments and rebuilds outputs.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable

import torch

from toycomp.capture import guards as G
from toycomp._torch_compat import tree_unflatten
from toycomp.capture.guard_compiler import compile_check

if TYPE_CHECKING:
    from toycomp.capture.tracer import LiftedTensor

__all__ = ["GuardedCall"]


class GuardedCall:
    """Guard checking and input / output flattening for ``CapturedGraph`` (a mixin: the
    dataclass ``CapturedGraph`` provides the fields annotated here)."""

    guards: list[G.Guard]
    lifted: list[LiftedTensor]
    signature: inspect.Signature | None
    state_readers: dict[str, Callable[[], Any]]
    output_spec: Any
    output_leaves: list  # int: index into gm's outputs; else a constant

    def _current_values(self, args: tuple, kwargs: dict) -> dict[str, Any] | None:
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

    @functools.cached_property
    def readers(self) -> dict[str, Callable[[], Any]]:
        """Source -> reader for every guarded value that is not an argument: module flags and
        closed-over constants (``state_readers``), and lifted tensors."""
        return {**self.state_readers, **{lt.name: lt.fetch for lt in self.lifted}}

    def check_guards(self, *args: Any, **kwargs: Any) -> G.Guard | None:
        """Return the first guard that fails for these arguments, or None when all pass."""
        values = self._current_values(args, kwargs)
        if values is None:
            return self.guards[0]  # the structure guard
        return G.first_failing(self.guards, values)

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

    @functools.cached_property
    def fast_check(self) -> Callable[[tuple, dict], list[torch.Tensor] | None] | None:
        """The guards compiled to one function (``guard_compiler.py``), or None if they need
        the general path (nested or keyword-only arguments, defaults)."""
        params = G.plain_parameter_names(self.signature) if self.signature else None
        return compile_check(self.guards, params, self.readers, self.input_sources)

    def guarded_inputs(self, args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
        """``flatten_inputs`` if every guard holds, else None: what a cache lookup on every call
        wants (``toycomp.compile``). The compiled check answers the common case; a miss (or a
        call it does not handle, like keyword arguments) takes the general path."""
        if self.fast_check is not None:
            flat = self.fast_check(args, kwargs)
            if flat is not None:
                return flat
        values = self._current_values(args, kwargs)
        if values is None or G.first_failing(self.guards, values) is not None:
            return None
        return [values[name] for name in self.input_sources]

    def unflatten_outputs(self, flat: tuple | list) -> Any:
        """Rebuild the structure ``fn`` returned from ``gm``'s flat tuple of tensors."""
        leaves = [flat[x] if isinstance(x, int) else x.value for x in self.output_leaves]
        return tree_unflatten(leaves, self.output_spec)
