"""Random programs for the fuzzer: generate from a seed, render to Python, run, classify, minimise.

Input -> output: a seed -> a ``Program`` (data: inputs with shapes and layouts, a list of ``Op``
records, outputs, the loss for the backward) -> standalone Python source -> an ``Outcome``
(ok / wrong / unclear error / clear error ...) of ``toycomp.compile`` against eager PyTorch.

Tiny example, the shape of ``print(render(generate(seed), backend="cpp"))`` (abridged)::

    def fn(x0, x1):
        v0 = torch.sin(x0)
        v1 = v0.amax((1,), keepdim=True)
        v2 = v1 * x1
        return v2

    def make_inputs():
        g = torch.Generator().manual_seed(7)
        x0 = (torch.rand(5, 3, generator=g) * 4 - 2).transpose(0, 1)  # shape (3, 5) strides (1, 3)
        x1 = torch.rand(3, 1, generator=g) * 4 - 2  # shape (3, 1) strides (1, 1)
        return [x0.requires_grad_(), x1.requires_grad_()]

    def loss(outs): ...       # sum((out * w).sum()) with a seeded random w, or sum(out.sum())
    def run(f): ...           # outputs, then every input's .grad
    expected = run(fn); compiled = toycomp.compile(fn, backend='cpp')
    ...                       # assert_close of each result, twice (the 2nd call hits the cache)

The checker executes that very text (``load``), so a printed reproducer is exactly what failed.
Programs are shape-correct by construction: every op is tried on meta tensors while generating,
and value magnitudes are tracked so that no value exceeds ``CAP`` (no overflow, no NaN in eager).

NB: the idea is TorchProbe's (random programs of PyTorch ops, compiled vs eager, values and
gradients); PyTorch's own compiler tests sweep OpInfos instead
(test/inductor/test_torchinductor_opinfo.py), as tests/fuzz/test_opinfo_sweep.py does here.
"""

# [Note: the tolerance rule]
# A result (an output or an input's gradient) is wrong when
#     torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
# fails (so NaN positions must agree too), with
#     rtol = 1e-4 * s,   atol = max(1e-5 * s * m,  4 * max|e - e64|),
# where e is eager's fp32 result, e64 the same program run eagerly in fp64, s = max(1, L / 64),
# m = max(1, max|e|) when L > 1 (1 otherwise),
# and L, the program's accumulation length, the largest number of terms any value or gradient of
# the program sums: a sum / mean over n elements, a softmax / log_softmax / layer_norm over n, a
# matmul with inner size k (and the sizes its gradients sum over) multiply the count of their
# operand, and so does a broadcast or expand by m (its gradient sums m terms).
# Why: fp32 sums of L terms added in another order differ by about eps * L relative to the
# partial sums (eps = 1.2e-7), hence s linear in L and, once anything is summed, atol following
# the tensor's magnitude (a sum that cancels to ~0 keeps the rounding of its large terms).
# The fp64 term covers ill-conditioned programs (cos of x**9, layer_norm over 2 elements,
# log near 0) where eager's own fp32 result is that far from the exact one: toycomp may not be
# held closer to eager than eager is to the truth. Programs without reductions whose eager fp32
# result is accurate get exactly the design's fp32 tolerance (rtol 1e-4, atol 1e-5).
# assert_close ignores the sign of zero; a zero of the other sign is reported as "signed zero",
# not as a failure: rewriting a gradient formula legitimately turns 0.0 into -0.0.
# The checker prints the per-result (rtol, atol) pairs as literals into the reproducer.

from __future__ import annotations

import linecache
import math
import random
import re
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

RTOL, ATOL = 1e-4, 1e-5
CAP = 1e4  # no value of a program exceeds this magnitude (inputs are uniform in [-2, 2])
MAX_NUMEL = 1 << 15  # no value has more elements (keeps the Triton interpreter quick)
BIG_PROB = 0.08  # chance that a program has one size over 1000
VALUE_RANGE = 2.0


# --- programs as data --------------------------------------------------------------------------
@dataclass(frozen=True)
class Input:
    """An input tensor: its shape and how it is laid out in memory.

    layout: "contiguous"; "transposed" (arg = (i, j): a contiguous tensor with dims i, j swapped,
    then transposed back); "sliced" (arg = (dim, start, step): every step-th element); "offset"
    (arg = (k,): a nonzero storage offset); "broadcast" (arg = (dim,): stride 0 along dim).
    Most inputs require grad; when none does, the program is compiled for inference only.
    """

    name: str
    shape: tuple[int, ...]
    layout: str = "contiguous"
    arg: tuple[int, ...] = ()
    grad: bool = True  # requires_grad


@dataclass(frozen=True)
class Op:
    """``out = KINDS[kind](args, params)``: one line of the program."""

    out: str
    kind: str
    args: tuple[str, ...]
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


@dataclass(frozen=True)
class Program:
    seed: int
    inputs: tuple[Input, ...]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]
    loss: str = "weighted"  # "weighted": sum((out * w).sum()), w random in [-1, 1]; "sum"
    # A third call with other sizes: every input size `old` becomes `new`. Same fn, so toycomp
    # recompiles, and its sizes become symbols (automatic dynamic shapes).
    resize: tuple[int, int] | None = None

    def kinds(self) -> list[str]:
        return [op.kind for op in self.ops]


# --- op kinds: how each renders ----------------------------------------------------------------
# Templates are str.format strings over the op's args (a, b, c) and params (repr'd, except
# strings, which are code). A kind's category says how its accumulation factor is computed.
KINDS: dict[str, tuple[str, str]] = {
    # unary pointwise
    "sin": ("torch.sin({a})", "pointwise"),
    "cos": ("torch.cos({a})", "pointwise"),
    "exp": ("torch.exp({a})", "pointwise"),
    "log": ("torch.log({a}.abs() + 0.01)", "pointwise"),
    "tanh": ("torch.tanh({a})", "pointwise"),
    "sigmoid": ("torch.sigmoid({a})", "pointwise"),
    "relu": ("torch.relu({a})", "pointwise"),
    "neg": ("-{a}", "pointwise"),
    "abs": ("{a}.abs()", "pointwise"),
    "sqrt": ("torch.sqrt({a}.abs() + 0.01)", "pointwise"),
    "rsqrt": ("torch.rsqrt({a}.abs() + 0.5)", "pointwise"),
    "gelu": ("torch.nn.functional.gelu({a})", "pointwise"),
    "gelu_tanh": ("torch.nn.functional.gelu({a}, approximate='tanh')", "pointwise"),
    "silu": ("torch.nn.functional.silu({a})", "pointwise"),
    "leaky_relu": ("torch.nn.functional.leaky_relu({a}, 0.1)", "pointwise"),
    "erf": ("torch.erf({a})", "pointwise"),
    "clamp": ("{a}.clamp({lo}, {hi})", "pointwise"),
    "pow_int": ("{a} ** {p}", "pointwise"),
    "pow_frac": ("({a}.abs() + 0.5) ** {p}", "pointwise"),
    "mul_scalar": ("{a} * {c}", "pointwise"),
    "add_scalar": ("{a} + {c}", "pointwise"),
    "rsub_scalar": ("{c} - {a}", "pointwise"),
    "div_scalar": ("{a} / {c}", "pointwise"),
    "where_scalar": ("torch.where({a} > {t}, {a}, {c})", "pointwise"),
    # binary pointwise (broadcasting)
    "add": ("{a} + {b}", "pointwise"),
    "sub": ("{a} - {b}", "pointwise"),
    "mul": ("{a} * {b}", "pointwise"),
    "div": ("{a} / ({b}.abs() + 1)", "pointwise"),
    "maximum": ("torch.maximum({a}, {b})", "pointwise"),
    "minimum": ("torch.minimum({a}, {b})", "pointwise"),
    "where": ("torch.where({b} > 0, {a}, {b})", "pointwise"),
    "pow": ("torch.pow({a}.abs() + 0.5, torch.tanh({b}))", "pointwise"),
    "mask": ("{a} * ({b} > 0)", "pointwise"),
    # reductions
    "sum": ("{a}.sum({dims}, keepdim={keepdim})", "reduce"),
    "mean": ("{a}.mean({dims}, keepdim={keepdim})", "reduce"),
    "amax": ("{a}.amax({dims}, keepdim={keepdim})", "max"),
    "amin": ("{a}.amin({dims}, keepdim={keepdim})", "max"),
    "var": ("{a}.var({dims}, keepdim={keepdim})", "reduce"),
    "sum_all": ("{a}.sum()", "reduce"),
    "mean_all": ("{a}.mean()", "reduce"),
    "amax_all": ("{a}.amax()", "max"),
    "softmax": ("torch.softmax({a}, dim={dim})", "softmax"),
    "log_softmax": ("torch.log_softmax({a}, dim={dim})", "softmax"),
    "layer_norm": ("torch.nn.functional.layer_norm({a}, {shape})", "layer_norm"),
    "layer_norm_affine": ("torch.nn.functional.layer_norm({a}, {shape}, {b}, {c})", "layer_norm"),
    # views and copies
    "transpose": ("{a}.transpose({i}, {j})", "view"),
    "permute": ("{a}.permute({perm})", "view"),
    "flatten": ("{a}.flatten({i}, {j})", "view"),
    "unflatten": ("{a}.unflatten({dim}, {sizes})", "view"),
    "reshape": ("{a}.reshape({shape})", "view"),
    "unsqueeze": ("{a}.unsqueeze({dim})", "view"),
    "squeeze": ("{a}.squeeze({dim})", "view"),
    "expand": ("{a}.expand({sizes})", "expand"),
    "slice": ("{a}[{index}]", "view"),
    "contiguous": ("{a}.contiguous()", "view"),
    "cat": ("torch.cat([{a}, {b}], dim={dim})", "view"),
    "cat_self": ("torch.cat([{a}, {a}], dim={dim})", "view"),
    "stack": ("torch.stack([{a}, {b}], dim={dim})", "view"),
    # matmul
    "matmul": ("{a} @ {b}", "matmul"),
    "gram": ("{a} @ {a}.transpose(-1, -2)", "matmul"),
}

# Params that hold sizes (the minimiser shrinks them together with the input shapes).
SIZE_PARAMS = ("shape", "sizes")


def render_op(op: Op) -> str:
    """The Python expression of one op record."""
    template = KINDS[op.kind][0]
    values = {k: (v if isinstance(v, str) else repr(v)) for k, v in op.params}
    values.update(zip("abc", op.args))
    return template.format(**values)


def _input_suffix(inp: Input) -> tuple[tuple[int, ...], str]:
    """(shape of the contiguous base tensor, the view expression applied to it)."""
    shape, arg = list(inp.shape), inp.arg
    if inp.layout == "transposed":
        i, j = arg
        shape[i], shape[j] = shape[j], shape[i]
        return tuple(shape), f".transpose({i}, {j})"
    if inp.layout == "sliced":
        dim, start, step = arg
        shape[dim] = start + (shape[dim] - 1) * step + 1
        return tuple(shape), "[" + ":, " * dim + f"{start}::{step}]"
    if inp.layout == "offset":
        shape[0] += arg[0]
        return tuple(shape), f"[{arg[0]}:]"
    if inp.layout == "broadcast":
        shape[arg[0]] = 1
        return tuple(shape), f".expand{tuple(inp.shape)!r}"
    return tuple(shape), ""


def _shape_args(shape: tuple[int, ...]) -> str:
    return ", ".join(map(str, shape)) + ", " if shape else "(), "


def render_input(inp: Input) -> str:
    base, suffix = _input_suffix(inp)
    expr = f"torch.rand({_shape_args(base)}generator=g) * 4 - 2"
    meta = eval(f"torch.empty({base!r}, device='meta'){suffix}", {"torch": torch})
    if suffix:
        expr = f"({expr}){suffix}"
    return f"{inp.name} = {expr}  # shape {tuple(meta.shape)} strides {tuple(meta.stride())}"


def render(program: Program, backend: str | None = None) -> str:
    """Standalone Python source: the program, its inputs, its loss; with a backend, the check."""
    p = program
    lines = ["import torch", "import toycomp", "", ""]
    lines.append(f"def fn({', '.join(i.name for i in p.inputs)}):")
    lines += [f"    {op.out} = {render_op(op)}" for op in p.ops]
    lines.append(f"    return {', '.join(p.outputs)}")
    lines += ["", ""] + _render_make_inputs("make_inputs", p)
    if p.resize is not None:
        lines += _render_make_inputs("make_inputs_2", resized(p))
    lines.append("def loss(outs):")
    if p.loss == "sum":
        lines.append("    return sum(o.sum() for o in outs)")
    else:
        lines.append(f"    g = torch.Generator().manual_seed({p.seed + 1})")
        lines.append(
            "    return sum((o * (torch.rand(o.shape, generator=g) * 2 - 1)).sum() for o in outs)"
        )
    lines += [
        "", "",
        "def run(f, make_inputs=make_inputs):",
        "    inputs = make_inputs()",
        "    outs = f(*inputs)",
        "    outs = outs if isinstance(outs, tuple) else (outs,)",
        "    if any(o.requires_grad for o in outs):",
        "        loss(outs).backward()",
        "    return [o.detach() for o in outs] + [x.grad for x in inputs]",
    ]
    if backend is not None:
        lines += _render_check(p, backend)
    return "\n".join(lines) + "\n"


def _render_make_inputs(name: str, p: Program) -> list[str]:
    lines = [f"def {name}():", f"    g = torch.Generator().manual_seed({p.seed})"]
    lines += ["    " + render_input(i) for i in p.inputs]
    names = ", ".join(i.name + (".requires_grad_()" if i.grad else "") for i in p.inputs)
    return lines + [f"    return [{names}]", "", ""]


def _tolerance_literal(program: Program) -> str:
    ref = reference(program)
    return repr([] if ref is None else [(round(r, 8), float(f"{a:.3g}")) for r, a in ref[1]])


def _render_check(program: Program, backend: str) -> list[str]:
    lines = [
        "", "",
        "def check(actual, expected, tolerances, call):",
        "    for i, (a, e, (rtol, atol)) in enumerate(zip(actual, expected, tolerances)):",
        "        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True,",
        "                                   msg=lambda m: f'call {call}, result {i}: {m}')",
        "", "",
        f"compiled = toycomp.compile(fn, backend={backend!r})",
        "# (rtol, atol) per result, outputs then input grads (rule: tests/fuzz/programs.py)",
        f"tolerances = {_tolerance_literal(program)}",
        "expected = run(fn)",
        "check(run(compiled), expected, tolerances, 1)",
        "check(run(compiled), expected, tolerances, 2)  # the cached compiled code",
    ]
    if program.resize is not None:
        lines += [
            f"# other sizes ({program.resize[0]} -> {program.resize[1]}): toycomp recompiles",
            f"tolerances = {_tolerance_literal(resized(program))}",
            "check(run(compiled, make_inputs_2), run(fn, make_inputs_2), tolerances, 3)",
        ]
    return lines + ["print('ok')"]


def resized(program: Program) -> Program:
    """The program of the third call: its input sizes changed by ``program.resize``."""
    assert program.resize is not None
    old, new = program.resize
    inputs = tuple(
        replace(i, shape=tuple(new if s == old else s for s in i.shape)) for i in program.inputs
    )
    return replace(program, inputs=inputs, resize=None)


# --- analysis: shapes on meta tensors, the accumulation length L -------------------------------
def analyze(program: Program) -> tuple[dict[str, tuple[int, ...]], int]:
    """Shapes of every value (running the ops on meta tensors) and the accumulation length L.

    Raises whatever PyTorch raises when the program is not shape-correct.
    """
    env = {i.name: torch.empty(i.shape, device="meta") for i in program.inputs}
    acc = {i.name: 1 for i in program.inputs}
    for op in program.ops:
        env[op.out] = eval(render_op(op), {"torch": torch}, env)
        factor = _acc_factor(op, {n: tuple(env[n].shape) for n in (*op.args, op.out)})
        acc[op.out] = max(acc[a] for a in op.args) * factor
    shapes = {name: tuple(t.shape) for name, t in env.items()}
    return shapes, max(acc.values())


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _acc_factor(op: Op, shapes: dict[str, tuple[int, ...]]) -> int:
    """How many terms one element of op's result (or of its operands' gradients) sums."""
    category = KINDS[op.kind][1]
    a, out = shapes[op.args[0]], shapes[op.out]
    if category == "reduce":
        return max(1, _numel(a) // max(1, _numel(out)))
    if category == "softmax":
        return a[op.param("dim")] if a else 1
    if category == "layer_norm":
        return _numel(op.param("shape"))
    if category == "matmul":
        k = a[-1]
        terms = [k] + [_numel(out) * k // max(1, _numel(shapes[x])) for x in op.args]
        return max(1, *terms)
    if category in ("pointwise", "expand"):
        return max(1, *(_numel(out) // max(1, _numel(shapes[x])) for x in op.args))
    return 1


def tolerance_scale(accumulation_length: int) -> float:
    """s of the tolerance rule (see [Note: the tolerance rule])."""
    return max(1.0, accumulation_length / 64)


# --- generation ---------------------------------------------------------------------------------
def generate(seed: int) -> Program:
    """The random program of this seed (the same on every machine and every run)."""
    return _Generator(seed).program()


def _size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.15:
        return 1
    if r < 0.6:
        return rng.randint(2, 8)
    return rng.choice([9, 11, 13, 15, 17, 19, 23, 31, 33, 37])


class _Generator:
    """Builds a program op by op, checking each on meta tensors, tracking magnitudes."""

    CATEGORIES = {
        "unary": 30, "binary": 25, "scalar": 8, "reduce": 17, "view": 20, "cat": 4, "matmul": 6,
    }

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.inputs: list[Input] = []
        self.ops: list[Op] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.bounds: dict[str, float] = {}

    def program(self) -> Program:
        rng = self.rng
        self.new_input(self.first_shape())
        n_ops = rng.randint(3, 8)
        for _ in range(60):
            if len(self.ops) == n_ops:
                break
            category = rng.choices(list(self.CATEGORIES), list(self.CATEGORIES.values()))[0]
            getattr(self, "gen_" + category)(self.operand())
        outputs = [self.ops[-1].out]
        others = [op.out for op in self.ops[:-1] if self.shapes[op.out] != ()]
        if others and rng.random() < 0.3:
            outputs.insert(0, rng.choice(others))
        loss = "sum" if rng.random() < 0.3 else "weighted"
        program = Program(self.seed, tuple(self.inputs), tuple(self.ops), tuple(outputs), loss)
        return self.with_resize(program) if rng.random() < 0.5 else program

    def with_resize(self, program: Program) -> Program:
        """Add a third call with one input size changed, if the ops allow it (not 0 or 1:
        toycomp, like Dynamo, may specialise those)."""
        sizes = sorted({s for i in program.inputs for s in i.shape if s >= 2})
        self.rng.shuffle(sizes)
        for old in sizes[:3]:
            new = old + self.rng.choice([1, 2]) if old < 3 or self.rng.random() < 0.6 else old - 1
            candidate = replace(program, resize=(old, new))
            try:
                shapes, _ = analyze(resized(candidate))
            except Exception:  # noqa: BLE001 - the ops fix this size; try another
                continue
            if all(0 < _numel(s) <= MAX_NUMEL for s in shapes.values()):
                return candidate
        return program

    # inputs
    def first_shape(self) -> tuple[int, ...]:
        rng = self.rng
        rank = rng.choices([0, 1, 2, 3, 4], [2, 20, 40, 25, 13])[0]
        shape = [_size(rng) for _ in range(rank)]
        if rank and rng.random() < BIG_PROB:
            shape[rng.randrange(rank)] = rng.randint(1001, 1500)
        while _numel(shape) > MAX_NUMEL // 4:  # leave room for broadcasts and expands
            i = max((d for d in range(rank) if shape[d] < 1000), key=lambda d: shape[d])
            shape[i] = max(1, shape[i] // 2)
        return tuple(shape)

    def new_input(self, shape: tuple[int, ...]) -> str:
        rng, name = self.rng, f"x{len(self.inputs)}"
        r, rank = rng.random(), len(shape)
        layout, arg = "contiguous", ()
        if r < 0.2 and rank >= 2:
            layout, arg = "transposed", tuple(sorted(rng.sample(range(rank), 2)))
        elif r < 0.35 and rank >= 1 and _numel(shape) * 3 <= MAX_NUMEL:
            layout, arg = "sliced", (rng.randrange(rank), rng.randint(0, 1), rng.randint(2, 3))
        elif r < 0.4 and rank >= 1:
            layout, arg = "offset", (rng.randint(1, 3),)
        elif r < 0.45 and any(s > 1 for s in shape):
            layout, arg = "broadcast", (rng.choice([d for d in range(rank) if shape[d] > 1]),)
        grad = rng.random() < 0.85
        self.inputs.append(Input(name, tuple(shape), layout, arg, grad))
        self.shapes[name], self.bounds[name] = tuple(shape), VALUE_RANGE
        return name

    def values(self) -> list[str]:
        return [i.name for i in self.inputs] + [op.out for op in self.ops]

    def operand(self) -> str:
        values = self.values()
        return values[-1] if self.rng.random() < 0.7 else self.rng.choice(values)

    def add(self, kind: str, args: tuple[str, ...], bound: float, **params: Any) -> str | None:
        """Append the op if it is shape-correct, small enough and bounded; else drop it."""
        if bound > CAP:
            return None
        op = Op(f"v{len(self.ops)}", kind, args, tuple(params.items()))
        env = {n: torch.empty(self.shapes[n], device="meta") for n in args}
        try:
            out = eval(render_op(op), {"torch": torch}, env)
        except Exception:  # noqa: BLE001 - a shape error: this op does not fit, try another
            return None
        if out.numel() > MAX_NUMEL or out.numel() == 0:
            return None
        self.ops.append(op)
        self.shapes[op.out], self.bounds[op.out] = tuple(out.shape), bound
        return op.out

    # pointwise
    def gen_unary(self, a: str) -> None:
        rng, b = self.rng, self.bounds[a]
        kind = rng.choice(
            ["sin", "cos", "exp", "log", "tanh", "sigmoid", "relu", "neg", "abs", "sqrt", "rsqrt",
             "gelu", "gelu_tanh", "silu", "leaky_relu", "erf", "clamp", "pow_int", "pow_frac"]
        )
        if kind == "clamp":
            lo = round(rng.uniform(-1.5, 0.5), 2)
            self.add(kind, (a,), b, lo=lo, hi=round(lo + rng.uniform(0.1, 2), 2))
        elif kind == "pow_int":
            p = rng.choice([2, 3])
            self.add(kind, (a,), b**p, p=p)
        elif kind == "pow_frac":
            p = rng.choice([0.5, 1.5, -0.5, 2.5])
            self.add(kind, (a,), max((b + 0.5) ** p, 0.5**p), p=p)
        elif kind == "exp":
            self.add(kind, (a,), math.exp(b) if b <= 6 else math.inf)
        else:
            bound = {"sin": 1, "cos": 1, "tanh": 1, "sigmoid": 1, "erf": 1, "rsqrt": 1.5,
                     "log": max(4.7, math.log(b + 0.01)), "sqrt": math.sqrt(b + 0.01)}
            self.add(kind, (a,), bound.get(kind, b + 0.2))

    def gen_scalar(self, a: str) -> None:
        rng, b = self.rng, self.bounds[a]
        c = round(rng.choice([-1, 1]) * rng.uniform(0.25, 3), 2)
        kind = rng.choice(["mul_scalar", "add_scalar", "rsub_scalar", "div_scalar", "where_scalar"])
        bound = {"mul_scalar": b * abs(c), "div_scalar": b / abs(c)}.get(kind, b + abs(c))
        if kind == "where_scalar":
            self.add(kind, (a,), bound, t=round(rng.uniform(-1, 1), 2), c=c)
        else:
            self.add(kind, (a,), bound, c=c)

    def gen_binary(self, a: str) -> None:
        kind = self.rng.choice(
            ["add", "sub", "mul", "div", "maximum", "minimum", "where", "pow", "mask"]
        )
        b = self.partner(a)
        ba, bb = self.bounds[a], self.bounds[b]
        bound = {"add": ba + bb, "sub": ba + bb, "mul": ba * bb, "div": ba, "mask": ba,
                 "pow": max(ba + 0.5, 2.0)}.get(kind, max(ba, bb))
        self.add(kind, (a, b), bound)

    def partner(self, a: str) -> str:
        """A second operand for a: a itself, a value that broadcasts with it, or a new input."""
        rng, shape = self.rng, self.shapes[a]
        r = rng.random()
        if r < 0.1:
            return a
        if r < 0.4:
            fits = [v for v in self.values() if v != a and self.broadcasts(shape, self.shapes[v])]
            if fits:
                return rng.choice(fits)
        return self.new_input(self.broadcast_shape(shape))

    def broadcasts(self, s1: tuple[int, ...], s2: tuple[int, ...]) -> bool:
        try:
            return _numel(torch.broadcast_shapes(s1, s2)) <= MAX_NUMEL
        except RuntimeError:
            return False

    def broadcast_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        rng, r = self.rng, self.rng.random()
        if r < 0.5 or not shape:
            return shape
        if r < 0.7:
            return tuple(1 if rng.random() < 0.5 else s for s in shape)
        if r < 0.85:
            return shape[rng.randint(1, len(shape)):]
        return tuple(rng.randint(2, 5) if s == 1 else s for s in shape)

    # reductions
    def gen_reduce(self, a: str) -> None:
        rng, shape, b = self.rng, self.shapes[a], self.bounds[a]
        rank = len(shape)
        kind = rng.choice(["sum", "mean", "amax", "amin", "var", "all", "softmax", "log_softmax",
                           "layer_norm"])
        if kind == "all" or rank == 0:
            kind = rng.choice(["sum_all", "mean_all", "amax_all"])
            self.add(kind, (a,), b * _numel(shape) if kind == "sum_all" else b)
        elif kind in ("softmax", "log_softmax"):
            dim = self.dim(rank)
            bound = 1 if kind == "softmax" else 2 * b + math.log(_numel(shape))
            self.add(kind, (a,), bound, dim=dim)
        elif kind == "layer_norm":
            ndims = rng.randint(1, min(rank, 2))
            norm = shape[rank - ndims:]
            bound = math.sqrt(_numel(norm)) + 1
            if rng.random() < 0.5:
                w, bias = self.new_input(norm), self.new_input(norm)
                self.add("layer_norm_affine", (a, w, bias), 2 * bound + 2, shape=norm)
            else:
                self.add(kind, (a,), bound, shape=norm)
        else:
            dims = rng.sample(range(rank), rng.randint(1, rank))
            dims = tuple(d - rank if rng.random() < 0.3 else d for d in sorted(dims))
            n = _numel([shape[d] for d in dims])
            if kind == "var" and n < 2:
                return  # the variance of one element is NaN (0 / 0 with Bessel's correction)
            bound = {"sum": b * n, "var": b * b}.get(kind, b)
            self.add(kind, (a,), bound, dims=dims, keepdim=rng.random() < 0.5)

    def dim(self, rank: int) -> int:
        d = self.rng.randrange(rank)
        return d - rank if self.rng.random() < 0.3 else d

    # views
    def gen_view(self, a: str) -> None:
        rng, shape, b = self.rng, self.shapes[a], self.bounds[a]
        rank = len(shape)
        kind = rng.choice(["transpose", "permute", "flatten", "unflatten", "reshape", "unsqueeze",
                           "squeeze", "expand", "slice", "slice", "contiguous"])
        if kind == "unsqueeze" or rank == 0:
            self.add("unsqueeze", (a,), b, dim=rng.randint(-rank - 1, rank))
        elif kind == "transpose" and rank >= 2:
            i, j = rng.sample(range(rank), 2)
            self.add(kind, (a,), b, i=i, j=j)
        elif kind == "permute" and rank >= 2:
            self.add(kind, (a,), b, perm=tuple(rng.sample(range(rank), rank)))
        elif kind == "flatten" and rank >= 2:
            i = rng.randrange(rank - 1)
            self.add(kind, (a,), b, i=i, j=rng.randint(i + 1, rank - 1))
        elif kind == "unflatten":
            self.gen_unflatten(a)
        elif kind == "reshape":
            self.gen_reshape(a)
        elif kind == "squeeze" and 1 in shape:
            self.add(kind, (a,), b, dim=rng.choice([d for d in range(rank) if shape[d] == 1]))
        elif kind == "expand":
            self.gen_expand(a)
        elif kind == "slice":
            self.gen_slice(a)
        elif kind == "contiguous":
            self.add(kind, (a,), b)

    def gen_unflatten(self, a: str) -> None:
        shape = self.shapes[a]
        dims = [d for d in range(len(shape)) if any(shape[d] % f == 0 for f in (2, 3, 5))]
        if dims:
            d = self.rng.choice(dims)
            f = self.rng.choice([f for f in (2, 3, 5) if shape[d] % f == 0])
            self.add("unflatten", (a,), self.bounds[a], dim=d, sizes=(f, -1))

    def gen_reshape(self, a: str) -> None:
        rng, numel = self.rng, _numel(self.shapes[a])
        factors = [f for f in range(2, min(numel, 40) + 1) if numel % f == 0]
        if not factors or rng.random() < 0.25:
            target: tuple[int, ...] = (-1,)
        else:
            f = rng.choice(factors)
            rest = numel // f
            g = rng.choice([x for x in range(1, min(rest, 12) + 1) if rest % x == 0])
            target = rng.choice([(f, -1), (-1, f), (f, g, -1), (g, -1, f)])
        self.add("reshape", (a,), self.bounds[a], shape=target)

    def gen_expand(self, a: str) -> None:
        rng, shape = self.rng, self.shapes[a]
        sizes = [rng.randint(2, 5) if s == 1 and rng.random() < 0.7 else -1 for s in shape]
        if rng.random() < 0.4 or all(s == -1 for s in sizes):
            sizes.insert(0, rng.randint(2, 4))
        self.add("expand", (a,), self.bounds[a], sizes=tuple(sizes))

    def gen_slice(self, a: str) -> None:
        rng, shape = self.rng, self.shapes[a]
        dims = [d for d in range(len(shape)) if shape[d] >= 2]
        if not dims:
            return
        d = rng.choice(dims)
        n, r = shape[d], rng.random()
        if r < 0.2:
            part = str(rng.randrange(n))  # select
        elif r < 0.6:
            part = f"{rng.randint(0, 1) or ''}::{rng.randint(2, 3)}"
        else:
            start = rng.randrange(n - 1)
            stop = rng.randint(start + 1, n)
            part = f"{start}:{stop - n if rng.random() < 0.3 and stop < n else stop}"
        prefix = "..., " if d == len(shape) - 1 and d > 0 and rng.random() < 0.5 else ":, " * d
        self.add("slice", (a,), self.bounds[a], index=prefix + part)

    # cat and matmul
    def gen_cat(self, a: str) -> None:
        rng, shape, b = self.rng, self.shapes[a], self.bounds[a]
        rank = len(shape)
        kind = rng.choice(["cat", "cat_self", "stack"]) if rank else "stack"
        dim = self.dim(rank + (kind == "stack")) if rank or kind == "stack" else 0
        if kind == "cat_self":
            self.add(kind, (a,), b, dim=dim)
            return
        if kind == "cat":
            other = list(shape)
            other[dim] = rng.randint(1, 7)
            same = [v for v in self.values() if v != a and self.shapes[v] == tuple(other)]
        else:
            other, same = list(shape), [v for v in self.values() if self.shapes[v] == shape]
        c = rng.choice(same) if same and rng.random() < 0.5 else self.new_input(tuple(other))
        self.add(kind, (a, c), max(b, self.bounds[c]), dim=dim)

    def gen_matmul(self, a: str) -> None:
        rng, shape, b = self.rng, self.shapes[a], self.bounds[a]
        if not shape:
            return
        k = shape[-1]
        if len(shape) >= 2 and rng.random() < 0.25:
            self.add("gram", (a,), b * b * k)
            return
        r = rng.random()
        if r < 0.15:
            other: tuple[int, ...] = (k,)
        elif r < 0.75 or len(shape) < 3:
            other = (k, _size(rng))
        else:
            other = (*shape[:-2], k, _size(rng))
        c = self.new_input(other)
        self.add("matmul", (a, c), b * self.bounds[c] * k)


# --- running a program ------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What happened when one program ran through toycomp on one backend.

    cls: "ok"; "fallback" (toycomp ran fn eagerly after a graph break: reported, not a failure);
    "signed zero" (all close, but some zero has the other sign than eager's: assert_close
    ignores it, and legitimate reorderings of a formula produce it; reported, not a failure);
    "clear error" (an exception that says which op or construct is unsupported: counted, not a
    failure); "unclear error" (any other exception); "wrong" (values or gradients differ from
    eager, NaN positions included: the worst); "crash" / "timeout" (the process died or hung);
    "invalid" (eager itself failed or overflowed: a bug of this generator).
    """

    cls: str
    signature: str
    detail: str = ""


FAILURES = ("wrong", "unclear error", "crash", "timeout", "invalid")


def load(program: Program) -> dict[str, Any]:
    """Execute the rendered program; return its namespace (fn, make_inputs, loss, run)."""
    source = render(program)
    filename = f"<fuzz program seed={program.seed} id={abs(hash(source)) % 10**8}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": "fuzz_program"}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    return namespace


def eager_results(program: Program, dtype: torch.dtype = torch.float32) -> list | None:
    """Eager outputs then input gradients; None when eager fails or leaves a non-finite value."""
    try:
        namespace = load(program)
        if dtype == torch.float32:
            results = namespace["run"](namespace["fn"])
        else:
            inputs = [
                x.detach().to(dtype).requires_grad_(x.requires_grad)
                for x in namespace["make_inputs"]()
            ]
            outs = namespace["fn"](*inputs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            if any(o.requires_grad for o in outs):
                namespace["loss"](outs).backward()
            results = [o.detach() for o in outs] + [x.grad for x in inputs]
    except Exception:  # noqa: BLE001 - an invalid program
        return None
    if any(r is not None and not torch.isfinite(r).all() for r in results):
        return None
    return results


def reference(program: Program) -> tuple[list, list[tuple[float, float]]] | None:
    """Eager fp32 results and their (rtol, atol) by the tolerance rule; None if invalid."""
    expected = eager_results(program)
    exact = eager_results(program, torch.float64)
    if expected is None or exact is None:
        return None
    accumulation = analyze(program)[1]
    s = tolerance_scale(accumulation)
    tolerances = []
    for e, e64 in zip(expected, exact):
        if e is None or e.numel() == 0:
            tolerances.append((RTOL * s, ATOL * s))
            continue
        rule = ATOL * s * (max(1.0, e.abs().max().item()) if accumulation > 1 else 1.0)
        fp32_error = (e.double() - e64).abs().max().item()
        tolerances.append((RTOL * s, max(rule, 4 * fp32_error)))
    return expected, tolerances


def check(program: Program, backend: str) -> Outcome:
    """Run the program eagerly and through ``toycomp.compile`` (twice); classify what happened."""
    import toycomp  # noqa: PLC0415 - imported late: toycomp may move under us between runs

    ref = reference(program)
    if ref is None:
        return Outcome("invalid", "invalid: eager fails or overflows", render(program))
    expected, tolerances = ref
    ns = load(program)
    compiled = toycomp.compile(ns["fn"], backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notes = []
        for call in ("", " (2nd call)"):  # the second call runs the cached compiled code
            phase = ["forward"]
            try:
                actual, n_outs = _run_compiled(ns, compiled, phase)
            except Exception as e:  # noqa: BLE001 - classified
                return classify_error(e, phase[0] + call.replace(" (", ", ").rstrip(")"))
            outcome = compare(actual, expected, n_outs, tolerances)
            if outcome is not None and outcome.cls == "wrong":
                return replace(outcome, signature=outcome.signature + call)
            notes.append(outcome)
        if program.resize is not None:
            outcome = _check_resized(program, compiled)
            if outcome is not None and outcome.cls != "signed zero":
                return outcome
            notes.append(outcome)
    eager = [str(w.message) for w in caught if "eagerly" in str(w.message)]
    if eager:
        return Outcome("fallback", "fallback: " + normalize(eager[0]), eager[0])
    return next((n for n in notes if n is not None), Outcome("ok", "ok"))


def _check_resized(program: Program, compiled: Callable) -> Outcome | None:
    """The third call, with other sizes: None when it matches eager."""
    other = resized(program)
    ref = reference(other)
    if ref is None:
        return Outcome("invalid", "invalid: eager fails or overflows (resized)", render(other))
    phase = ["forward"]
    try:
        actual, n_outs = _run_compiled(load(other), compiled, phase)
    except Exception as e:  # noqa: BLE001 - classified
        return classify_error(e, phase[0] + ", resized call")
    wrong = compare(actual, ref[0], n_outs, ref[1])
    return None if wrong is None else replace(wrong, signature=wrong.signature + " (resized call)")


def _run_compiled(ns: dict[str, Any], compiled: Callable, phase: list[str]) -> tuple[list, int]:
    """The rendered ``run(f)``, step by step so that an error says which phase raised it."""
    inputs = ns["make_inputs"]()
    outs = compiled(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    if any(o.requires_grad for o in outs):
        phase[0] = "backward"
        ns["loss"](outs).backward()
    return [o.detach() for o in outs] + [x.grad for x in inputs], len(outs)


def compare(actual: list, expected: list, n_outputs: int, tolerances: list) -> Outcome | None:
    """None when every output and gradient is close (the tolerance rule); else a "wrong" Outcome,
    or a "signed zero" one (not a failure) when they are close but a zero has the other sign."""
    if len(actual) != len(expected):
        return Outcome("wrong", "wrong values (output count)", f"{len(actual)} != {len(expected)}")
    note = None
    for i, (a, e, (rtol, atol)) in enumerate(zip(actual, expected, tolerances)):
        what = "values" if i < n_outputs else "grads"
        label = f"output {i}" if i < n_outputs else f"grad of input {i - n_outputs}"
        if a is None or e is None:
            if a is not e:
                return Outcome("wrong", f"wrong {what} (None)", f"{label}: {a!r} vs {e!r}")
            continue
        try:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as err:
            nan = a.is_floating_point() and a.shape == e.shape and bool(
                (torch.isnan(a) != torch.isnan(e)).any()
            )
            sig = f"wrong {what}" + (" (NaN)" if nan else "")
            return Outcome("wrong", sig, f"{label} (rtol {rtol:.3g}, atol {atol:.3g}): {err}")
        if note is None and a.is_floating_point() and a.shape == e.shape:
            flipped = (a == 0) & (e == 0) & (torch.signbit(a) != torch.signbit(e))
            if flipped.any():
                where = tuple(flipped.nonzero()[0].tolist())
                note = Outcome(
                    "signed zero", f"signed zero in {what}",
                    f"{label}: {int(flipped.sum())} zeros of the other sign, first at {where}: "
                    f"{a[where].item()} instead of {e[where].item()}",
                )
    return note


# [Note: clear and unclear errors]
# An error is "clear" when it says that something is unsupported and names what: its type is
# NotImplementedError (toycomp's Unsupported included), or its message says "not supported",
# "unsupported", "is not implemented", or "no rule/lowering/decomposition for"; and the message
# names an op or construct (aten.X / prims.X / torch.X / tl.X, a dtype, an in-place op, a
# data-dependent value, an index expression, a layout...). Every other exception, including
# toycomp's internal consistency checks ("changed shape") and PyTorch errors raised from inside
# the compiled code, is "unclear": a failure.
_UNSUPPORTED = re.compile(
    r"not supported|unsupported|is not implemented|no (rule|lowering|decomposition|"
    r"out-of-place version) for|cannot functionali[sz]e",
    re.IGNORECASE,
)
_NAMES_SOMETHING = re.compile(
    r"\b(aten|prims|torch|tl|libdevice)\.\w+|\bdtype\b|float16|bfloat16|float64|int64|in-place|"
    r"data-dependent|index expression|layout|rounding_mode|subclass|device|mutat|dynamic",
    re.IGNORECASE,
)


def classify_error(error: BaseException, phase: str = "") -> Outcome:
    message = f"{type(error).__name__}: {error}"
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    unsupported = isinstance(error, NotImplementedError) or _UNSUPPORTED.search(message)
    cls = "clear error" if unsupported and _NAMES_SOMETHING.search(message) else "unclear error"
    where = f" [{phase}]" if phase else ""
    return Outcome(cls, normalize(first) + where, message[:2000])


def normalize(text: str) -> str:
    """A message with its numbers, names and shapes blanked, for grouping failures."""
    text = re.sub(r"0x[0-9a-f]+", "0x?", text)
    text = re.sub(r"<fuzz program[^>]*>", "<fuzz>", text)
    text = re.sub(r"\b([A-Za-z_]+?)_?\d+\b", r"\1#", text)
    text = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", text)
    text = re.sub(r"[\[(]N(, N)*,?[\])]", "(shape)", text)
    return text[:160]


# --- minimisation ----------------------------------------------------------------------------
def minimize(
    program: Program, backend: str, outcome: Outcome, budget: int = 80,
    log: Callable[[str], None] | None = None,
) -> tuple[Program, Outcome]:
    """Delta debugging: drop outputs and ops, simplify inputs, shrink sizes while it still fails.

    "Still fails" means: same outcome signature (an error's normalised message, or for a wrong
    result whether values or gradients and whether NaN). At most ``budget`` compilations.
    """
    state = {"left": budget, "best": program, "outcome": outcome}

    def fails(candidate: Program) -> bool:
        candidate = prune(candidate)
        if state["left"] <= 0 or candidate == state["best"] or not _valid(candidate):
            return False
        state["left"] -= 1
        got = check(candidate, backend)
        if got.signature != outcome.signature:
            return False
        state["best"], state["outcome"] = candidate, got
        if log:
            shapes = [i.shape for i in candidate.inputs]
            log(f"  minimise: {len(candidate.ops)} ops, inputs {shapes}")
        return True

    changed = True
    while changed and state["left"] > 0:
        changed = False
        for step in (_try_outputs, _try_bypass, _try_simplify_inputs, _try_shrink):
            changed |= step(state["best"], fails)
    return rename(state["best"]), state["outcome"]


def _valid(program: Program) -> bool:
    variants = [program] + ([resized(program)] if program.resize is not None else [])
    for p in variants:
        try:
            shapes, _ = analyze(p)
        except Exception:  # noqa: BLE001 - not shape-correct
            return False
        if not p.ops or any(_numel(s) == 0 or _numel(s) > MAX_NUMEL for s in shapes.values()):
            return False
        if reference(p) is None:
            return False
    return True


def prune(program: Program) -> Program:
    """Drop ops and inputs that no output depends on."""
    live = set(program.outputs)
    ops = []
    for op in reversed(program.ops):
        if op.out in live:
            ops.append(op)
            live.update(op.args)
    inputs = tuple(i for i in program.inputs if i.name in live)
    return replace(program, ops=tuple(reversed(ops)), inputs=inputs)


def _try_outputs(p: Program, fails: Callable[[Program], bool]) -> bool:
    if len(p.outputs) > 1 and any(fails(replace(p, outputs=(o,))) for o in p.outputs):
        return True
    # The earliest single value that still fails: a prefix of the program.
    return any(fails(replace(p, outputs=(op.out,))) for op in p.ops[:-1])


def _try_bypass(p: Program, fails: Callable[[Program], bool]) -> bool:
    """Remove one op, its uses reading one of its operands instead."""
    for op in reversed(p.ops):
        for arg in dict.fromkeys(op.args):
            if fails(_substitute(p, op.out, arg)):
                return True
    return False


def _substitute(p: Program, old: str, new: str) -> Program:
    ops = tuple(
        replace(op, args=tuple(new if a == old else a for a in op.args))
        for op in p.ops if op.out != old
    )
    return replace(p, ops=ops, outputs=tuple(new if o == old else o for o in p.outputs))


def _try_simplify_inputs(p: Program, fails: Callable[[Program], bool]) -> bool:
    if p.resize is not None and fails(replace(p, resize=None)):
        return True
    if p.loss != "sum" and fails(replace(p, loss="sum")):
        return True
    if any(i.grad for i in p.inputs):
        if fails(replace(p, inputs=tuple(replace(i, grad=False) for i in p.inputs))):
            return True
    for k, inp in enumerate(p.inputs):
        if inp.layout != "contiguous":
            inputs = p.inputs[:k] + (Input(inp.name, inp.shape, grad=inp.grad),) + p.inputs[k + 1:]
            if fails(replace(p, inputs=inputs)):
                return True
    return False


def _try_shrink(p: Program, fails: Callable[[Program], bool]) -> bool:
    """Replace one size value everywhere (input shapes, size params) by a smaller one."""
    sizes = sorted({s for i in p.inputs for s in i.shape if s > 1}, reverse=True)
    for s in sizes:
        for smaller in sorted({1, 2, 3, s // 2} - {s}):
            if smaller < s and fails(_resize(p, s, smaller)):
                return True
    return False


def _resize(p: Program, old: int, new: int) -> Program:
    def sub(shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(new if s == old else s for s in shape)

    inputs = tuple(replace(i, shape=sub(i.shape)) for i in p.inputs)
    ops = tuple(
        replace(op, params=tuple((k, sub(v) if k in SIZE_PARAMS else v) for k, v in op.params))
        for op in p.ops
    )
    resize = p.resize
    if resize is not None and old in resize:
        resize = None if new in resize else tuple(new if s == old else s for s in resize)
    return replace(p, inputs=inputs, ops=ops, resize=resize)


def rename(p: Program) -> Program:
    """Number inputs x0, x1... and values v0, v1... in order of appearance."""
    names = {i.name: f"x{k}" for k, i in enumerate(p.inputs)}
    names.update({op.out: f"v{k}" for k, op in enumerate(p.ops)})
    inputs = tuple(replace(i, name=names[i.name]) for i in p.inputs)
    ops = tuple(
        replace(op, out=names[op.out], args=tuple(names[a] for a in op.args)) for op in p.ops
    )
    return replace(p, inputs=inputs, ops=ops, outputs=tuple(names[o] for o in p.outputs))


# Families of op kinds, to name a minimised failure: two reproducers whose ops are of the same
# families in the same order are most likely one bug ("log -> amin" and "cos -> amax").
FAMILIES = {
    "amax": "amax/amin", "amin": "amax/amin", "amax_all": "amax/amin",
    "sum": "sum/mean", "mean": "sum/mean", "sum_all": "sum/mean", "mean_all": "sum/mean",
    "var": "var",
    "softmax": "softmax", "log_softmax": "softmax",
    "layer_norm": "layer_norm", "layer_norm_affine": "layer_norm",
    "transpose": "permute", "permute": "permute", "contiguous": "contiguous",
    "flatten": "reshape", "unflatten": "reshape", "reshape": "reshape",
    "unsqueeze": "unsqueeze", "squeeze": "unsqueeze", "expand": "expand", "slice": "slice",
    "cat": "cat", "cat_self": "cat", "stack": "cat", "matmul": "matmul", "gram": "matmul",
}


def families(program: Program) -> list[str]:
    """The program's op families in order, runs of one family merged (pointwise ops are one)."""
    names = [FAMILIES.get(kind, "pointwise") for kind in program.kinds()]
    return [n for k, n in enumerate(names) if k == 0 or names[k - 1] != n]


def describe(program: Program) -> str:
    """A short name for a minimised program: its op families and its unusual input layouts."""
    notes = sorted({f"{i.layout} input" for i in program.inputs if i.layout != "contiguous"})
    notes += [] if any(i.grad for i in program.inputs) else ["no grad"]
    notes += [] if program.resize is None else ["resized call"]
    return " -> ".join(families(program)) + (f" [{', '.join(notes)}]" if notes else "")
