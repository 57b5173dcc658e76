"""ATen calls whose every argument is a Python number (``aten.add(4, 3.3)``).

Eager wraps the numbers into 0-d tensors and promotes them as numbers (``tensor(7.3000)``, a
float32); the decompositions expect at least one tensor operand, so ``decompose`` wraps the
first number. Eager gives values and dtypes.
"""

import pytest
import torch

import toycomp

aten = torch.ops.aten


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize(
    "call",
    [
        lambda: aten.add(4, 3.3),  # int and float: the default float dtype
        lambda: aten.add(4, 3),  # ints: int64
        lambda: aten.mul(2.5, 4),
        lambda: aten.sub(7, 10),
        lambda: aten.div(7, 2),  # true division of ints: a float
        lambda: aten.mul(True, 3),  # bool and int: int64
        lambda: aten.maximum(aten.add(1, 2), aten.mul(2, 2)),  # on the 0-d results
    ],
    ids=["add_int_float", "add_ints", "mul", "sub", "div", "mul_bool", "nested"],
)
def test_all_number_aten_call(call, backend):
    def fn(x):
        c = call()
        return x + c, c * 2

    x = torch.arange(4, dtype=torch.float32)
    expected = fn(x)
    got = toycomp.compile(fn, backend=backend)(x)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float64], ids=str)
def test_all_number_call_with_out(dtype, backend):
    def fn(x, t):
        torch.add(2, 3, out=t)
        return x * t

    x = torch.arange(3).to(dtype)
    t_eager, t_compiled = torch.empty((), dtype=dtype), torch.empty((), dtype=dtype)
    expected = fn(x, t_eager)
    got = toycomp.compile(fn, backend=backend)(x, t_compiled)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(t_compiled, t_eager)  # the out= tensor was written


def test_a_refused_rule_falls_back_with_the_wrapped_number(monkeypatch):
    # the first number is wrapped in a 0-d prims.full before the rule runs; a rule that emits
    # nodes and then refuses has them erased, and its fallback still reads the wrapped number
    from toycomp.prims.decomp_table import DECOMPOSITIONS, Unsupported

    rule = DECOMPOSITIONS[aten.sub.Tensor]

    def refusing(a, *args, **kwargs):
        rule(a, *args, **kwargs)  # emits nodes first, as a rule that refuses late does
        raise Unsupported("refused for the test")

    monkeypatch.setitem(DECOMPOSITIONS, aten.sub.Tensor, refusing)

    def fn(x):
        return x * aten.sub(7, 10)

    x = torch.arange(4, dtype=torch.float32)
    with pytest.warns(UserWarning, match="aten.sub.Tensor"):
        got = toycomp.compile(fn)(x)
    torch.testing.assert_close(got, fn(x))
