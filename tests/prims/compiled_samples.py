"""Test helper: many OpInfo samples as ONE function, compiled by ``toycomp.compile`` and compared
with eager (outputs, input gradients, and the inputs after the call: running statistics).

One function for many samples costs one C++ compilation per graph instead of one per sample;
``check`` says which sample and which result differ.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

import toycomp


class SampleCalls:
    """``fn(t0, t1, ...)`` returns the outputs of ``op(sample)`` for each sample, flattened, and
    ``labels[k]`` says which sample (and which of its outputs) result ``k`` is. Built from source
    text: tensors become parameters, every other argument a named constant."""

    def __init__(self, op: Callable, samples: list[Any]) -> None:
        self.tensors: list[torch.Tensor] = []
        self.constants: dict[str, Any] = {"op": op}
        lines, self.counts = [], []
        for sample in samples:
            args = [self._expr(sample.input)] + [self._expr(a) for a in sample.args]
            args += [f"{k}={self._expr(v)}" for k, v in sample.kwargs.items()]
            lines.append(f"    outs.append(op({', '.join(args)}))")
        params = ", ".join(f"t{i}" for i in range(len(self.tensors)))
        self.source = f"def fn({params}):\n    outs = []\n" + "\n".join(lines)
        self.source += "\n    return outs\n"
        namespace = dict(self.constants)
        exec(compile(self.source, "<samples>", "exec"), namespace)  # noqa: S102
        self.fn: Callable = namespace["fn"]

    def _expr(self, value: Any) -> str:
        if isinstance(value, torch.Tensor):
            self.tensors.append(value)
            return f"t{len(self.tensors) - 1}"
        name = f"c{len(self.constants) - 1}"
        self.constants[name] = value
        return name


def _flat(outs: list) -> list:
    flat = []
    for k, out in enumerate(outs):
        items = out if isinstance(out, (tuple, list)) else [out]
        flat += [(f"sample {k} output {j}", o) for j, o in enumerate(items)]
    return flat


def run(fn: Callable, tensors: list[torch.Tensor]) -> list[tuple[str, Any]]:
    """(label, value) of every output, every input gradient of sum(out * w) with fixed weights
    w, and every input after the call; on fresh copies of ``tensors``."""
    inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    outs = _flat(fn(*inputs))
    diff = [o for _, o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    wrt = [t for t in inputs if t.requires_grad]
    results = [(label, o.detach() if isinstance(o, torch.Tensor) else o) for label, o in outs]
    if diff and wrt:
        g = torch.Generator().manual_seed(0)
        loss = sum((o * (torch.rand(o.shape, generator=g) * 2 - 1).to(o.dtype)).sum() for o in diff)
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        names = [f"t{i}" for i, t in enumerate(inputs) if t.requires_grad]
        results += [(f"gradient of {n}", gr) for n, gr in zip(names, grads)]
    results += [(f"t{i} after the call", t.detach()) for i, t in enumerate(inputs)]
    return results


def check(
    fn: Callable, tensors: list[torch.Tensor], backend: str, rtol: float = 1e-4, atol: float = 1e-5
) -> Any:
    """Compile ``fn``, compare every result of ``run`` with eager's; return the compiled fn."""
    expected = run(fn, tensors)
    compiled = toycomp.compile(fn, backend=backend)
    actual = run(compiled, tensors)
    assert [label for label, _ in actual] == [label for label, _ in expected]
    for (label, got), (_, want) in zip(actual, expected):
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), label
            torch.testing.assert_close(
                got, want, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{label}: {m}"
            )
        else:
            assert got == want, label
    return compiled


def fallbacks(compiled: Any) -> list[str]:
    """The ATen ops that ``compiled``'s graphs left to eager."""
    return [f for entry in compiled.entries for g in entry.graphs for f in g.fallbacks]
