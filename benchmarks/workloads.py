"""The benchmark's workloads: issue 9's rows, each a function to compile plus its inputs.

A ``Row`` names a workload and its sizes on each device; ``Row.case(device, quick)`` builds a
``Case``: the function, its inputs (fixed seed), and what one step does with them::

    >>> case = ROWS[0].case("cpu", quick=True)
    >>> case.name, case.shape, case.backward, case.floor_bytes
    ('sin²+cos² fwd', '4096', False, 32768)

One step of a forward row is ``fn(*args)``; of a forward + backward row it is
``fn(*args).backward(grad)`` (a fixed random ``grad``, or none for a scalar loss) after setting
the gradients of ``params`` to None, so each step computes them afresh (no accumulation).

``floor_bytes`` is the least memory traffic of one step for the memory-bound rows (None for
the matmul-bound MLPs): see [Note: the copy-bandwidth floor].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

FLOAT = 4  # bytes of a float32

# [Note: the copy-bandwidth floor]
# A memory-bound step cannot run faster than the bytes it must move divided by the rate at
# which the device copies memory (measured in the same run: a large device-to-device copy,
# counting bytes read plus bytes written). "Must move": the forward reads each of its inputs
# once and writes each output once; a backward, which autograd starts only after the forward
# has returned, reads the incoming gradient and the input it differentiates at once more, and
# writes each gradient once (so sin²+cos² forward + backward moves 5 N floats: x and y in the
# forward, grad, x and grad_x in the backward). Small per-row or per-column vectors (a bias, a
# LayerNorm's weight, mean and rstd) are counted where they are inputs or outputs; values a
# program may save for the backward are not, since recomputing them is free of traffic.
# The large copy's rate is a limit that smaller steps do not reach: every kernel pays a few
# microseconds that do not shrink with its size (its launch ramping up and draining, and the
# dirty lines that do_bench's clearing of the L2 left behind). So each row also times a plain
# copy that moves its own bytes (the "copy" column): on the H100 a copy of 128 MB (the 16M
# sin²+cos² row) reached 0.905 of the floor, one of 256 MB 0.954.


@dataclass
class Case:
    """One workload at one size: call ``step_of(fn)`` for a step of any compiled ``fn``."""

    name: str
    shape: str
    fn: Callable
    args: tuple
    backward: bool
    floor_bytes: int | None
    grad: torch.Tensor | None = None  # the backward's incoming gradient (None: scalar loss)
    params: list[torch.Tensor] = field(default_factory=list)  # whose .grad a step computes
    rounds: int = 5  # rounds of the compilers' steps taking turns (Row.rounds)

    def step_of(self, fn: Callable) -> Callable[[], Any]:
        """A zero-argument callable running one step of ``fn`` (a compiled ``self.fn``)."""
        if not self.backward:
            return lambda: fn(*self.args)

        def step() -> Any:
            for p in self.params:
                p.grad = None
            out = fn(*self.args)
            out.backward(self.grad)
            return out

        return step

    def results_of(self, fn: Callable) -> list[torch.Tensor]:
        """The tensors one step of ``fn`` produces: its outputs, then the gradients."""
        out = self.step_of(fn)()
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o.detach().clone() for o in outs] + [p.grad.clone() for p in self.params]


@dataclass
class Row:
    """A workload and its sizes: ``sizes[device]`` (CUDA and CPU) and ``sizes["quick"]``."""

    name: str
    make: Callable[..., Case]
    sizes: dict[str, tuple[int, ...] | None]
    backward: bool = False
    rounds: int = 5  # see [Note: rounds of a host-bound step]

    def case(self, device: str, quick: bool = False) -> Case | None:
        """The case at this device's size (None: the row does not run there)."""
        size = self.sizes["quick" if quick else device]
        if size is None:
            return None
        torch.manual_seed(0)
        case = self.make(self.name, device, *size, backward=self.backward)
        case.shape, case.rounds = "x".join(map(str, size)), self.rounds
        return case


def _randn(*size: int, device: str, grad: bool = False) -> torch.Tensor:
    return torch.randn(*size, device=device).requires_grad_(grad)


def sin2_cos2(x: torch.Tensor) -> torch.Tensor:
    """The course's running example."""
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def sin_cos_case(name: str, device: str, n: int, backward: bool) -> Case:
    x = _randn(n, device=device, grad=backward)
    grad = _randn(n, device=device) if backward else None
    floor = (5 if backward else 2) * n * FLOAT
    return Case(name, "", sin2_cos2, (x,), backward, floor, grad, [x] if backward else [])


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + bias)


def bias_gelu_case(name: str, device: str, m: int, k: int, backward: bool) -> Case:
    args = (_randn(m, k, device=device), _randn(k, device=device))
    return Case(name, "", bias_gelu, args, False, (2 * m * k + k) * FLOAT)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def softmax_case(name: str, device: str, m: int, k: int, backward: bool) -> Case:
    x = _randn(m, k, device=device, grad=backward)
    if not backward:
        return Case(name, "", softmax, (x,), False, 2 * m * k * FLOAT)
    grad = _randn(m, k, device=device)
    return Case(name, "", softmax, (x,), True, 5 * m * k * FLOAT, grad, [x])


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:])


def layer_norm_affine(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w, b)


def layer_norm_case(name: str, device: str, m: int, k: int, backward: bool) -> Case:
    if not backward:
        return Case(name, "", layer_norm, (_randn(m, k, device=device),), False, 2 * m * k * FLOAT)
    x = _randn(m, k, device=device, grad=True)
    w = (1 + 0.1 * torch.randn(k, device=device)).requires_grad_(True)
    b = _randn(k, device=device, grad=True)
    grad = _randn(m, k, device=device)
    floor = (5 * m * k + 4 * k) * FLOAT  # x, y; grad, x, grad_x; w, b, grad_w, grad_b
    return Case(name, "", layer_norm_affine, (x, w, b), True, floor, grad, [x, w, b])


def mlp_case(name: str, device: str, batch: int, d: int, hidden: int, backward: bool) -> Case:
    """Linear(d, hidden) -> GELU -> Linear(hidden, d), forward + backward (matmul-bound)."""
    model = torch.nn.Sequential(
        torch.nn.Linear(d, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d)
    ).to(device)
    x, grad = _randn(batch, d, device=device), _randn(batch, d, device=device)
    return Case(name, "", model, (x,), True, None, grad, list(model.parameters()))


def course_mlp_case(name: str, device: str, batch: int, backward: bool) -> Case:
    """The course's MLP training step: Linear(64,128) -> GELU -> Linear(128,10), cross-entropy."""
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)
    ).to(device)

    def mlp_loss(inp: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(inp), target)

    args = (_randn(batch, 64, device=device), torch.randint(0, 10, (batch,), device=device))
    return Case(name, "", mlp_loss, args, True, None, None, list(model.parameters()))


def column_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=0)


def column_sum_case(name: str, device: str, m: int, k: int, backward: bool) -> Case:
    return Case(name, "", column_sum, (_randn(m, k, device=device),), False, (m * k + k) * FLOAT)


# Single ops on the CPU (issue 29): a lone kernel shows the C++ backend's code for one op, where
# sin²+cos² lets fusion hide a slow sin. Each reads and writes 4M floats (32 MB, within twice
# the L3 of the 2-core machine); log reads |x| + 1 and pow |x| so that every value is finite.
UNARY_OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 1), "sigmoid": torch.sigmoid, "gelu": F.gelu,
    "pow": lambda x: torch.pow(x.abs(), 2.5), "sum": torch.sum,
}  # fmt: skip


def unary_case(name: str, device: str, n: int, backward: bool) -> Case:
    op = UNARY_OPS[name.split()[0]]
    out = 1 if name.startswith("sum") else n
    return Case(name, "", op, (_randn(n, device=device),), False, (n + out) * FLOAT)


# [Note: rounds of a host-bound step]
# A step of a few small kernels (the course's MLP: batch 32) is bound by the host, and the
# lent GPU machine's host drifts: on the H100 its rounds spread from 0.55 to 0.95 ms for each
# compiler alike, so the median of five rounds moved a compiler's ratio between 0.79 and 1.06
# from one run to the next. Such a row takes three times as many rounds (each as long as
# another row's), which narrows the spread of the median; a device-bound row's rounds agree
# within a percent, and five are enough.
HOST_BOUND_ROUNDS = 15
M = 1024 * 1024
ROWS = [
    # issue 9's GPU table, at its sizes on CUDA; CPU-sized on the CPU, 64 MB a matrix: twice
    # the 32 MB L3 cache of the 2-core machine, so the copy-bandwidth floor means memory there
    Row("sin²+cos² fwd", sin_cos_case, {"cuda": (16 * M,), "cpu": (4 * M,), "quick": (4096,)}),
    Row("bias+GELU fwd", bias_gelu_case,
        {"cuda": (8192, 4096), "cpu": (4096, 4096), "quick": (64, 128)}),
    Row("softmax fwd", softmax_case,
        {"cuda": (8192, 4096), "cpu": (4096, 4096), "quick": (64, 128)}),
    Row("layer_norm fwd", layer_norm_case,
        {"cuda": (8192, 4096), "cpu": (4096, 4096), "quick": (64, 128)}),
    Row("sin²+cos² fwd+bwd", sin_cos_case,
        {"cuda": (16 * M,), "cpu": (4 * M,), "quick": (4096,)}, backward=True),
    Row("softmax fwd+bwd", softmax_case,
        {"cuda": (8192, 4096), "cpu": (4096, 4096), "quick": (64, 128)}, backward=True),
    Row("layer_norm w,b fwd+bwd", layer_norm_case,
        {"cuda": (8192, 4096), "cpu": (4096, 4096), "quick": (64, 128)}, backward=True),
    Row("MLP 1024-4096-1024 fwd+bwd", mlp_case,
        {"cuda": (8192, 1024, 4096), "cpu": (256, 1024, 4096), "quick": (16, 32, 64)},
        backward=True),
    # today's small ones (issue 9's text); on the CPU sin²+cos² 4M is the first row already
    Row("course MLP train step", course_mlp_case, {"cuda": (32,), "cpu": (32,), "quick": (8,)},
        backward=True, rounds=HOST_BOUND_ROUNDS),
    Row("row softmax", softmax_case,
        {"cuda": (8192, 1000), "cpu": (8192, 1000), "quick": (32, 100)}),
    Row("column sum", column_sum_case,
        {"cuda": (4096, 4096), "cpu": (4096, 4096), "quick": (64, 64)}),
    Row("sin²+cos² fwd (small)", sin_cos_case, {"cuda": (4 * M,), "cpu": None, "quick": None}),
    # single ops, on the CPU only (see UNARY_OPS)
    *(Row(f"{op} (one op)", unary_case, {"cuda": None, "cpu": (4 * M,), "quick": (4096,)})
      for op in UNARY_OPS),
]  # fmt: skip


def row_named(name: str) -> Row:
    return next(r for r in ROWS if r.name == name)


def tensor_bytes(n: int) -> str:
    """``1.5 GB``-style size (decimal units, as bandwidths are quoted)."""
    if n <= 0:
        return "0"
    unit = min(int(math.log10(n) // 3), 4)
    return f"{n / 10 ** (3 * unit):.4g} {['B', 'kB', 'MB', 'GB', 'TB'][unit]}"
