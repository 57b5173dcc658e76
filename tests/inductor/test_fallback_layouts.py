"""ATen fallbacks receive their inputs laid out as eager would have them, and multi-output
fallbacks return real tensors for every output.

``as_strided`` and ``view_as_complex`` read the storage itself: given toycomp's contiguous
``x + 1`` where eager's is channels_last or transposed, nearly every element would differ (see
[Note: fallbacks see eager's strides] in toycomp/inductor/lowering_meta.py). Eager is the
oracle.
"""

import pytest
import torch

import toycomp
from toycomp.inductor.lowering_meta import dense_order

BACKENDS = ["cpp", "triton"]


def _check(fn, *args, backend):
    expected = fn(*args)
    got = toycomp.compile(fn, backend=backend)(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for e, g in zip(expected, got, strict=True):
        assert type(g) is torch.Tensor
        torch.testing.assert_close(g, e)


def test_dense_order():
    assert dense_order((2, 3, 4, 5), (60, 1, 15, 3)) == [0, 2, 3, 1]  # channels_last
    assert dense_order((4, 3), (1, 4)) == [1, 0]  # a transpose
    assert dense_order((4, 1, 3), (1, 99, 4)) == [1, 2, 0]  # a size-1 dim's stride is free
    assert dense_order((4, 3), (0, 1)) is None  # expanded: not dense
    assert dense_order((4, 3), (6, 2)) is None  # a gap


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32], ids=str)
def test_as_strided_of_a_transposed_intermediate(dtype, backend):
    x = torch.arange(12).reshape(3, 4).to(dtype).t()  # (4, 3), strides (1, 4)
    _check(lambda x: torch.as_strided(x + 1, (4, 3), (1, 4)), x, backend=backend)
    _check(lambda x: torch.as_strided(x * 2, (6, 2), (2, 1)), x, backend=backend)
    _check(lambda x: torch.as_strided(x * 2, (5,), (2,), 1), x, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "shape, fmt",
    [((2, 3, 4, 5), torch.channels_last), ((2, 3, 2, 4, 3), torch.channels_last_3d)],
    ids=["channels_last", "channels_last_3d"],
)
def test_as_strided_of_a_channels_last_intermediate(shape, fmt, backend):
    x = torch.randn(shape).to(memory_format=fmt)
    n = x.numel()
    _check(lambda x: torch.as_strided(x + 1, (n,), (1,)), x, backend=backend)  # storage order
    _check(lambda x: torch.as_strided(x.sin() * 2, (shape[0], n // shape[0]), (n // shape[0], 1)),
           x, backend=backend)  # fmt: skip
    _check(lambda x: torch.as_strided(torch.relu(x), (3, 4), (1, 3)), x, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeat_then_as_strided(backend):
    x = torch.randn(3, 4)
    _check(lambda x: torch.as_strided(x.repeat(2, 1), (3, 3), (1, 3)), x, backend=backend)
    _check(lambda x: torch.as_strided(x.t().repeat(1, 2) + 1, (4, 5), (2, 3)), x, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_as_complex_of_computed_values(backend):
    x = torch.randn(5, 3, 2)
    _check(lambda x: torch.view_as_real(torch.view_as_complex(x * 2) * 3), x, backend=backend)
    _check(lambda x: torch.view_as_complex((x + 1).transpose(0, 1).contiguous()).abs(), x,
           backend=backend)  # fmt: skip
    xp = torch.randn(3, 5, 2).permute(1, 0, 2)  # a permuted input: eager keeps its order
    _check(lambda x: torch.view_as_real(torch.view_as_complex((x * 2).contiguous())), xp,
           backend=backend)  # fmt: skip


# --- multi-output fallbacks: every output is a real tensor -----------------------------------
@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w: torch.histogramdd(x, bins=[3, 3], weight=w),
        lambda x, w: tuple(e * 2 for e in torch.histogramdd(x, bins=[3, 4], weight=w).bin_edges),
        lambda x, w: torch.histogram(x[:, 0], bins=5, weight=w),
    ],
    ids=["histogramdd", "bin_edges_used", "histogram"],
)
def test_multi_output_fallback_through_torch_compile(fn):
    torch.manual_seed(0)
    x, w = torch.randn(20, 2), torch.rand(20)
    expected = torch.utils._pytree.tree_leaves(fn(x, w))
    got = torch.utils._pytree.tree_leaves(torch.compile(fn, backend="toycomp")(x, w))
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert type(g) is torch.Tensor  # never a FakeTensor
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w: torch.histogramdd(x, bins=[3, 3], weight=w),  # (hist, [edges, edges])
        lambda x, w: [e - 1 for e in torch.histogramdd(x, bins=[2, 4]).bin_edges],
    ],
    ids=["histogramdd", "bin_edges_used"],
)
def test_multi_output_fallback_through_toycomp_compile(fn):
    x, w = torch.randn(20, 2), torch.rand(20)
    expected = torch.utils._pytree.tree_leaves(fn(x, w))
    got = torch.utils._pytree.tree_leaves(toycomp.compile(fn)(x, w))
    for e, g in zip(expected, got, strict=True):
        assert type(g) is torch.Tensor
        torch.testing.assert_close(g, e)
