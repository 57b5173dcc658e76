"""toycomp.config: flags, patch(), the presets, and compile(options=): both presets give eager's
values and gradients; teach's code has none of the optimisations, fast's has them."""

from __future__ import annotations

import pytest
import torch

import toycomp
from toycomp import config


def sincos(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def kernel_sources(fn, *inputs, **options) -> dict[str, list[str]]:
    """The C++ kernels and wrapper of ``fn``'s forward and backward, compiled under ``options``."""
    with config.patch(options):
        e = toycomp.explain(fn, *inputs)
    return {g: [k.source for k in e.graph(g).compiled.kernels] + [e.graph(g).compiled.wrapper_source]
            for g in ("forward", "backward")}  # fmt: skip


# --- the flags and patch ---------------------------------------------------------------------
def test_presets_name_every_flag_and_teach_turns_all_off():
    assert set(config.teach) == set(config.fast) == set(config.DEFAULTS)
    assert config.fast == config.snapshot()  # the defaults are the fast preset
    assert all(v in (False, 0) for v in config.teach.values())
    assert config.teach["cpp.simdlen"] == 0 and config.fast["cpp.simdlen"] is None
    # named as Inductor's flags where Inductor has one
    from torch._inductor import config as inductor_config

    for name in ("split_reductions", "memory_planning", "max_autotune", "cpp.simdlen",
                 "triton.cudagraphs", "triton.mix_order_reduction"):  # fmt: skip
        assert name in config.DEFAULTS
        owner, _, attr = name.rpartition(".")
        assert hasattr(getattr(inductor_config, owner) if owner else inductor_config, attr)


def test_patch_as_context_manager_restores_even_on_error():
    before = config.snapshot()
    with pytest.raises(RuntimeError):
        with config.patch(**config.teach):
            assert config.snapshot() == config.teach
            assert config.get("cpp.simdlen") == 0 and config.cpp.simdlen == 0
            raise RuntimeError
    assert config.snapshot() == before


def test_patch_as_decorator_and_nested():
    @config.patch(split_reductions=False)
    def inner():
        with config.patch({"cpp.layouts": False}):
            return config.split_reductions, config.cpp.layouts

    assert inner() == (False, False)
    assert inner() == (False, False)  # the decorator can run twice
    assert config.split_reductions and config.cpp.layouts


@pytest.mark.parametrize("bad", ["no_such_flag", "cpp.no_such", "triton", "patch", "_FLAT",
                                 "torch.cuda"])  # fmt: skip
def test_unknown_flags_raise(bad):
    with pytest.raises(AttributeError, match="no flag"):
        config.patch(**{bad: True})
    with pytest.raises(AttributeError, match="no flag"):
        toycomp.compile(sincos, options={bad: True})
    assert config.snapshot() == config.fast


# --- the presets' code -----------------------------------------------------------------------
def test_teach_kernel_is_short_and_plain_and_fast_keeps_its_optimisations():
    x = torch.randn(4096, requires_grad=True)
    teach = kernel_sources(sincos, x, **config.teach)
    fast = kernel_sources(sincos, x)
    (kernel, wrapper) = teach["forward"]
    assert len(kernel.splitlines()) <= 40, kernel
    for optimised in ("toycomp_sin", "TOYCOMP_SAME_LIBM", "omp simd", "sincos"):
        assert optimised not in kernel
    assert "std::sin" in kernel and "std::cos" in kernel
    assert "toycomp_sincosf" in fast["forward"][0]  # the vector math is the fast preset's
    assert "args.clear()" not in wrapper and "args.clear()" in fast["forward"][1]
    # the flags change the code, so the kernel cache (keyed by source) keeps both apart
    assert teach["forward"][0] != fast["forward"][0]


def test_options_apply_to_one_function_only():
    x = torch.randn(256)
    plain = toycomp.compile(sincos, options=config.teach)
    fast = toycomp.compile(sincos)
    torch.testing.assert_close(plain(x), sincos(x))
    torch.testing.assert_close(fast(x), sincos(x))
    assert config.snapshot() == config.fast
    source = lambda f: f.entries[0].graphs[0].compiled.kernels[0].source  # noqa: E731
    assert "std::sin" in source(plain) and "toycomp_sincosf" in source(fast)


def test_torch_compile_options_reach_the_backend():
    x = torch.randn(64, requires_grad=True)
    torch._dynamo.reset()
    f = torch.compile(sincos, backend="toycomp", options=config.teach)
    y = f(x)
    y.sum().backward()
    torch.testing.assert_close(y, sincos(x))
    torch.testing.assert_close(x.grad, torch.zeros_like(x), atol=1e-5, rtol=0)
    torch._dynamo.reset()


# --- both presets are eager's values and gradients -------------------------------------------
def layer_norm_mlp(x, w, b):
    h = torch.nn.functional.gelu(x @ w + b)
    return torch.nn.functional.layer_norm(h, h.shape[-1:]).softmax(-1)


def column_and_row(x):
    return x.sum(0) * x.amax(1, keepdim=True) + torch.cat([x, x.exp()], 1)[:, ::3].mean(1, True)


def reductions_3d(x):
    return x.var(dim=(0, 2), keepdim=True) + x.logsumexp(1, keepdim=True)


CASES = {
    "mlp": (layer_norm_mlp, lambda: [torch.randn(32, 16), torch.randn(16, 24), torch.randn(24)]),
    "columns": (column_and_row, lambda: [torch.randn(33, 20)]),
    "3d": (reductions_3d, lambda: [torch.randn(4, 5, 70)]),
    "sincos": (sincos, lambda: [torch.randn(5000)]),
}


@pytest.mark.parametrize("preset", ["teach", "fast"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_presets_match_eager(case, backend, dtype, preset):
    fn, make = CASES[case]
    torch.manual_seed(0)
    inputs = [t.to(dtype).requires_grad_() for t in make()]
    eager_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    compiled = toycomp.compile(fn, backend=backend, options=getattr(config, preset))
    for _ in range(2):  # the second call runs the cached code
        got, want = compiled(*inputs), fn(*eager_inputs)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        grad = torch.randn_like(want)
        got.backward(grad)
        want.backward(grad)
        for a, b in zip(inputs, eager_inputs):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
            a.grad = b.grad = None
