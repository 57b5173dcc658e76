"""Stage 4b, the registry: the ``LOWERINGS`` table, ``register_lowering`` and ``LoweringError``.

Input -> output: nothing runs here. ``lowering_rules.py`` fills ``LOWERINGS`` (prim -> rule) with
``@register_lowering(prims.permute)``, and ``lowering.GraphLowering`` reads it. A leaf module, so
that the rules and the pass import it rather than each other::

    >>> import toycomp.prims as prims
    >>> import toycomp.inductor.lowering  # the pass imports the rules, which fill the table
    >>> LOWERINGS[prims.permute].__name__
    '_permute'

NB: in PyTorch this lives in torch/_inductor/lowering.py (``lowerings``, ``register_lowering``).
"""

from __future__ import annotations

from typing import Any, Callable

from toycomp.inductor.tensor_value import TensorValue

# A rule is called as ``rule(graph, out, *args, **kwargs)``: ``graph`` is the GraphLowering,
# ``out`` a meta tensor with the node's size and dtype, ``args`` hold TensorValues where the FX
# node had tensors. It returns the TensorValue of the result.
Rule = Callable[..., TensorValue]

# prim function -> its rule
LOWERINGS: dict[Callable[..., Any], Rule] = {}


class LoweringError(RuntimeError):
    """A node that toycomp can neither lower nor run as a fallback (the message names it)."""


def register_lowering(*targets: Callable[..., Any]) -> Callable[[Rule], Rule]:
    """Decorator: ``@register_lowering(prims.permute, ...)`` adds ``rule`` to ``LOWERINGS``."""

    def wrap(rule: Rule) -> Rule:
        for target in targets:
            LOWERINGS[target] = rule
        return rule

    return wrap
