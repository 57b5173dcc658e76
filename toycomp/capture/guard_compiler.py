"""Guards compiled to one Python function: list[Guard] -> ``check(args, kwargs)``.

Checking guards one ``Guard`` object at a time (``guards.first_failing``) is clear but slow: it
flattens the arguments, builds a dict of every source's value and looks each one up again. A
compiled function runs on *every* call of a ``toycomp.compile``d function, so, like Dynamo, we
turn the guards into straight-line code once. For ``f(x)`` traced on 1000 float32s:

    >>> from toycomp.capture.tracer import capture
    >>> captured = capture(lambda x: x.sin(), torch.randn(1000))
    >>> print(captured.fast_check.source)
    def check(args, kwargs):
        # a0: x
        if kwargs or len(args) != 1:
            return None
        a0, = args
        if not (
            isinstance(a0, Tensor)
            and torch.is_grad_enabled() is True
            and a0.shape == E0
            and a0.stride() == E1
            ...
        ):
            return None
        return [a0]

It returns the graph's flat inputs when every guard holds and ``None`` otherwise (the caller then
falls back to the slow, explaining path). Only the common case compiles: plain positional
parameters, each a tensor or a Python constant; anything else returns ``None`` from
``compile_check`` and keeps the slow path.

NB: in PyTorch this lives in torch/_dynamo/guards.py (GuardBuilder emits guard code, compiled
into a C++ GuardManager tree since PyTorch 2.3).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from toycomp.capture import guards as G

_TENSOR_CHECKS = {
    "shape": "{v}.shape == {e}",
    "stride": "{v}.stride() == {e}",
    "dtype": "{v}.dtype == {e}",
    "device": "{v}.device == {e}",
    "requires_grad": "{v}.requires_grad == {e}",
}
_OTHER_CHECKS = {
    "value": "type({v}) is type({e}) and {v} == {e}",
    "identity": "{v} is {e}",
}


def compile_check(
    guards: Sequence[G.Guard],
    params: tuple[str, ...] | None,
    readers: dict[str, Callable[[], Any]],
    input_sources: Sequence[str],
) -> Callable[[tuple, dict], list[torch.Tensor] | None] | None:
    """Compile ``guards`` into ``check(args, kwargs) -> flat inputs | None``.

    Args:
        guards: the captured graph's guards.
        params: the function's plain positional parameter names (None: not plain, no fast path).
        readers: source -> zero-argument function reading it (lifted tensors, module flags).
        input_sources: the sources of the graph's placeholders, in order.

    Returns:
        The compiled check, or None when the guards need the general (slow) path.
    """
    if params is None or any(p not in params and p not in readers for p in input_sources):
        return None
    names = {p: f"a{i}" for i, p in enumerate(params)} | {s: f"r{i}" for i, s in enumerate(readers)}
    env: dict[str, Any] = {"Tensor": torch.Tensor, "torch": torch}
    env.update({f"read{i}": read for i, read in enumerate(readers.values())})
    conds: list[str] = []
    for guard in guards:
        if guard.kind == "structure":  # arity is checked first; nested structures don't compile
            kinds = [kind.split(": ", 1) for kind in guard.expected]
            if [name for name, _ in kinds] != list(params):
                return None  # nested or variadic arguments: keep the general path
            conds += [f"isinstance({names[n]}, Tensor)" for n, kind in kinds if kind == "Tensor"]
            continue
        if guard.source == G.GRAD_MODE:
            conds.append(f"torch.is_grad_enabled() is {guard.expected}")
            continue
        elif guard.source in names:
            value = names[guard.source]
        else:
            return None
        if guard.kind == "alias":
            conds.append(f"{value} is {names[guard.expected]}")
            continue
        template = _TENSOR_CHECKS.get(guard.kind) or _OTHER_CHECKS.get(guard.kind)
        if template is None:
            return None
        constant = f"E{sum(name.startswith('E') for name in env)}"
        env[constant] = guard.expected
        conds.append(template.format(v=value, e=constant))
    return _build(params, names, readers, conds, input_sources, env)


def _build(params, names, readers, conds, input_sources, env) -> Callable:
    unpack = ", ".join(names[p] for p in params) + ("," if len(params) == 1 else "")
    legend = ", ".join(f"{names[s]}: {s}" for s in (*params, *readers))
    lines = [
        "def check(args, kwargs):",
        f"    # {legend}",
        f"    if kwargs or len(args) != {len(params)}:",
        "        return None",
    ]
    if params:
        lines.append(f"    {unpack} = args")
    if readers:
        lines.append("    try:")
        lines += [f"        {names[s]} = read{i}()" for i, s in enumerate(readers)]
        lines += ["    except (AttributeError, KeyError, ValueError):", "        return None"]
    if conds:
        lines += ["    if not (", f"        {conds[0]}"]
        lines += [f"        and {cond}" for cond in conds[1:]]
        lines += ["    ):", "        return None"]
    lines.append(f"    return [{', '.join(names[s] for s in input_sources)}]")
    source = "\n".join(lines)
    exec(compile(source, "<toycomp guards>", "exec"), env)
    check = env["check"]
    check.source = source  # readable: print(captured.fast_check.source)
    return check
