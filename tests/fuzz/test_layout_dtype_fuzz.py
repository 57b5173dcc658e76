"""Random programs over every integer dtype and over channels_last / transposed inputs.

The main fuzzer (programs.py) draws float32 programs with gradients; this one draws short
forward programs whose inputs are integers of any width (values over the whole range, so that
``+``, ``*``, ``neg``, ``abs`` and ``pow`` overflow and must wrap around as eager's do) or
float32, each laid out contiguous, transposed or channels_last. Integer results must equal
eager's exactly; float results within the design's fp32 tolerance. A failing seed prints its
program, which runs standalone (``exec`` it, then ``check("cpp")``).
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch

import toycomp

INT_DTYPES = ["torch.uint8", "torch.int8", "torch.int16", "torch.int32", "torch.int64"]
SHAPE = (2, 3, 4, 5)
LAYOUTS = {
    "contiguous": "",
    "channels_last": ".contiguous(memory_format=torch.channels_last)",
    "transposed": ".transpose(1, 3).contiguous().transpose(1, 3)",  # strides of a transpose
}
# op templates: {a}, {b} operands (same shape or broadcast), {e} a small non-negative exponent
INT_OPS = [
    "{a} + {b}", "{a} - {b}", "{a} * {b}", "-{a}", "{a}.abs()", "{a} * {a} * {a}",
    "torch.pow({a}, 87)", "torch.pow({a}, 5)", "torch.pow({a}, {e})", "{a} * 1000 + 77",
    "torch.maximum({a}, {b})", "torch.minimum({a}, {b})", "torch.where({a} > {b}, {a}, {b} * 3)",
    "({a} == {b}).to({a}.dtype) + {a}", "{a}.sum(1, keepdim=True) + {b}",
    "{a}.amax(2, keepdim=True) * {b}", "{a}.permute(0, 2, 3, 1).permute(0, 3, 1, 2) + {b}",
]  # fmt: skip
FLOAT_OPS = [
    "{a} + {b}", "{a} * {b}", "torch.sin({a})", "torch.relu({a})", "{a}.sum(1, keepdim=True)",
    "{a}.amax((2, 3), keepdim=True) - {b}", "torch.softmax({a}, 1)", "{a}.mean(0, keepdim=True)",
    "torch.where({a} > 0, {a}, {b})", "{a}.permute(0, 2, 3, 1).permute(0, 3, 1, 2) * 2",
]  # fmt: skip


def generate(seed: int) -> str:
    """The source of one program: ``make_inputs``, ``fn`` and ``check(backend)``."""
    rng = random.Random(seed)
    dtype = rng.choice(INT_DTYPES + ["torch.float32"])
    is_int = dtype != "torch.float32"
    lines = ["import torch", "import toycomp", "", "def make_inputs():",
             f"    g = torch.Generator().manual_seed({seed})"]  # fmt: skip
    names = []
    for k in range(rng.randint(1, 3)):
        shape = SHAPE if k == 0 or rng.random() < 0.6 else (1, SHAPE[1], 1, 1)
        layout = LAYOUTS[rng.choice(list(LAYOUTS))]
        if is_int:
            make = f"torch.randint(-2**62, 2**62, {shape}, generator=g).to({dtype})"
        else:
            make = f"(torch.rand({shape}, generator=g) * 4 - 2)"
        lines.append(f"    x{k} = {make}{layout}")
        names.append(f"x{k}")
    lines.append("    e = torch.randint(0, 9, SHAPE_E, generator=g)".replace("SHAPE_E", str(SHAPE))
                 + (f".to({dtype})" if is_int else ""))  # fmt: skip
    lines.append(f"    return [{', '.join(names)}, e]")
    lines += ["", f"def fn({', '.join(names)}, e):"]
    values = list(names)
    for k in range(rng.randint(2, 6)):
        template = rng.choice(INT_OPS if is_int else FLOAT_OPS)
        a, b = rng.choice(values), rng.choice(values)
        lines.append(f"    v{k} = {template.format(a=a, b=b, e='e')}")
        values.append(f"v{k}")
    outputs = [values[-1]] + ([rng.choice(values[len(names):])] if rng.random() < 0.5 else [])
    lines.append(f"    return {', '.join(outputs)},")
    lines += [
        "", "def check(backend):",
        "    expected = fn(*make_inputs())",
        "    got = toycomp.compile(fn, backend=backend)(*make_inputs())",
        "    for e, g in zip(expected, got, strict=True):",
        "        assert g.dtype == e.dtype and g.shape == e.shape",
        "        tol = {} if g.dtype.is_floating_point else dict(rtol=0, atol=0)",
        "        torch.testing.assert_close(g, e, **tol)",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def test_programs_are_reproducible_and_overflow():
    assert generate(3) == generate(3) and generate(3) != generate(4)
    sources = [generate(s) for s in range(40)]
    assert sum("torch.int" in s or "torch.uint8" in s for s in sources) > 20
    assert sum("channels_last" in s for s in sources) > 10


def _run(seed: int, backend: str) -> None:
    source = generate(seed)
    namespace: dict = {}
    exec(compile(source, f"<layout_dtype_fuzz seed {seed}>", "exec"), namespace)  # noqa: S102
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # visible fallbacks (x % y, shifts...) are fine here
        try:
            namespace["check"](backend)
        except AssertionError as e:
            pytest.fail(f"seed {seed} [{backend}]: {e}\n\n{source}", pytrace=False)


@pytest.mark.parametrize("seed", range(60))
def test_random_program_cpp(seed):
    _run(seed, "cpp")


@pytest.mark.parametrize("seed", range(40))
def test_random_program_triton(seed):
    _run(seed, "triton")
