"""``F.scaled_dot_product_attention`` through toycomp with every kernel PyTorch may pick (issue 32).

Each case forces one kernel with ``torch.nn.attention.sdpa_kernel`` and runs a forward and a
backward through ``toycomp.compile`` and ``torch.compile(backend="toycomp")``:

- on the CPU (CI): the math kernel (decomposed: matmul externs, fused softmax) and the CPU flash
  kernel (an extern), in fp32, bf16 and fp16; causal, an additive mask, a boolean mask,
  grouped-query attention, dropout; and under CPU autocast (bf16);
- on CUDA (skipped without it): math, flash, memory-efficient and cuDNN. A combination the
  kernel does not support (flash in fp32, a mask with flash...) is skipped when eager refuses it
  under the same ``sdpa_kernel``, so the skips list what this GPU and PyTorch lack;
- the CUDA kernels' kinds of results (ints, None, RNG state on either device) on the CPU, through
  stand-ins that return what they return (tests/aot/cuda_attention_standins.py).

Tolerances are PyTorch's own for SDPA (``get_tolerances`` in test/test_transformers.py): the
reference runs in float64 with the math kernel; eager in the tested dtype and kernel deviates from
it by some amount; toycomp may deviate by ``FUDGE`` times that (at least the dtype's default
atol), with the dtype's default rtol.
Dropout: with a seed, the random stream is eager's (compare); without relying on that, the
fraction dropped matches ``dropout_p`` and the backward's mask is the forward's (``v`` the
identity: the output is the dropped attention matrix, and ``grad_v`` must be ``out^T @ w``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import toycomp
from tests.aot import cuda_attention_standins

# a graph that toycomp gave up on and ran eagerly would pass any comparison with eager: an error
pytestmark = pytest.mark.filterwarnings("error:toycomp. a graph .*runs eagerly")
aten = torch.ops.aten
CUDA = torch.cuda.is_available()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# test/test_transformers.py's default_atol / default_rtol, and a fudge factor as its tests use
DEFAULT_ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-5}
DEFAULT_RTOL = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float32: 1.3e-6}
FUDGE = 2.0
# the ATen op each kernel leaves in AOT's forward graph (math: none, it is decomposed)
KERNEL_OPS = {
    SDPBackend.FLASH_ATTENTION: {aten._scaled_dot_product_flash_attention_for_cpu.default,
                                 aten._scaled_dot_product_flash_attention.default},
    SDPBackend.EFFICIENT_ATTENTION: {aten._scaled_dot_product_efficient_attention.default},
    SDPBackend.CUDNN_ATTENTION: {aten._scaled_dot_product_cudnn_attention.default},
    SDPBackend.MATH: set(),
}  # fmt: skip
SDPA_OPS = set().union(*KERNEL_OPS.values())
VARIANTS = ["plain", "causal", "float_mask", "bool_mask", "gqa"]


def get_tolerances(true, computed, fudge=FUDGE):
    """test/test_transformers.py's atol: ``computed``'s largest deviation from ``true`` (at least
    the dtype's default), times ``fudge``. Its rtol (the largest relative deviation) reaches 17
    for bf16 gradients here, which would let anything pass: we keep the dtype's default."""
    atol = (true - computed.to(true.dtype)).abs().max().item()
    return fudge * max(atol, DEFAULT_ATOL[computed.dtype]), fudge * DEFAULT_RTOL[computed.dtype]


# -- the attention functions and their inputs -------------------------------------------------
def attention(variant: str, dropout_p: float = 0.0):
    """The function to compile: SDPA with ``variant``'s options; a mask is an input."""
    causal, gqa = variant == "causal", variant == "gqa"

    def sdpa(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                              is_causal=causal, enable_gqa=gqa)  # fmt: skip

    return sdpa


def make_inputs(variant, dtype, device, b=2, h=4, lq=6, lk=10, e=8, seed=0):
    """q, k, v (and the mask) in ``dtype`` on ``device``, q, k and v requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    hk = h // 2 if variant == "gqa" else h
    shapes = [(b, h, lq, e), (b, hk, lk, e), (b, hk, lk, e)]
    qkv = [torch.randn(s, generator=gen).to(device, dtype).requires_grad_() for s in shapes]
    if variant == "float_mask":
        return [*qkv, torch.randn(lq, lk, generator=gen).to(device, dtype)]
    if variant == "bool_mask":
        mask = torch.rand(b, 1, lq, lk, generator=gen) > 0.4
        mask[..., 0] = True  # no query masked out whole (the fused kernels would give NaN)
        return [*qkv, mask.to(device)]
    return qkv


def run(fn, inputs, backend):
    """``fn``'s output and the gradients of ``sum(out * w)`` for its float inputs that require
    grad, under ``sdpa_kernel(backend)``."""
    inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    with sdpa_kernel([backend]):
        out = fn(*inputs)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        wrt = [x for x in inputs if x.requires_grad]
        grads = torch.autograd.grad((out * w).sum(), wrt)
    return out.detach(), grads


def compiled(fn, path):
    if path == "toycomp":
        return toycomp.compile(fn)
    # a fresh Dynamo: a function compiled before with another dropout_p would recompile with a
    # dynamic float (read with .item(), which toycomp's AOT refuses: the graph runs eagerly)
    torch._dynamo.reset()
    return torch.compile(fn, backend="toycomp")


def check_sdpa(variant, dtype, backend, path, device, **sizes):
    """Compiled forward and gradients against the float64 math reference, within the tolerance
    eager's own deviation from that reference gives (``get_tolerances``)."""
    fn = attention(variant)
    inputs = make_inputs(variant, dtype, device, **sizes)
    try:
        eager = run(fn, inputs, backend)
    except RuntimeError as e:  # "No available kernel": this kernel cannot take this case
        pytest.skip(f"eager has no {backend.name} kernel for this: {str(e).splitlines()[0]}")
    as64 = [x.detach().double().requires_grad_(x.requires_grad) if x.is_floating_point() else x
            for x in inputs]  # fmt: skip
    reference = run(fn, as64, SDPBackend.MATH)
    ours = run(compiled(fn, path), inputs, backend)
    names = ["out", "grad_q", "grad_k", "grad_v"]
    for name, ref, lp, got in zip(names, [reference[0], *reference[1]], [eager[0], *eager[1]],
                                  [ours[0], *ours[1]]):  # fmt: skip
        assert got.dtype == lp.dtype and got.shape == lp.shape, name
        atol, rtol = get_tolerances(ref, lp)
        torch.testing.assert_close(got.double(), ref, atol=atol, rtol=rtol, msg=name)
    return fn, inputs


def forward_targets(fn, inputs, backend):
    """The call targets of the forward graph that toycomp.compile makes of ``fn``."""
    with sdpa_kernel([backend]):
        compiled_fn = toycomp.compile(fn)
        compiled_fn(*inputs)
    entry = compiled_fn.entries[0]
    fallbacks = [f for g in entry.graphs for f in g.fallbacks]
    return {n.target for n in entry.aot.forward.graph.nodes if n.op == "call_function"}, fallbacks


# -- CPU: math and flash (CI) -----------------------------------------------------------------
CPU_BACKENDS = [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", CPU_BACKENDS, ids=lambda b: b.name)
def test_cpu_sdpa_toycomp_compile(backend, dtype, variant):
    fn, inputs = check_sdpa(variant, dtype, backend, "toycomp", "cpu")
    if dtype is torch.float32:  # the kernel forced is the one compiled, and nothing falls back
        targets, fallbacks = forward_targets(fn, inputs, backend)
        assert targets & SDPA_OPS == KERNEL_OPS[backend] & targets and not fallbacks, fallbacks
        assert (targets & SDPA_OPS) or backend is SDPBackend.MATH


@pytest.mark.parametrize("variant", ["causal", "bool_mask", "gqa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", CPU_BACKENDS, ids=lambda b: b.name)
def test_cpu_sdpa_torch_compile(backend, dtype, variant):
    check_sdpa(variant, dtype, backend, "dynamo", "cpu")


def test_cpu_flash_kernel_is_an_extern_in_both_graphs():
    fn, inputs = attention("causal"), make_inputs("causal", torch.float32, "cpu")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        ex = toycomp.explain(fn, *inputs)
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in _targets(ex.forward)
    assert aten._scaled_dot_product_flash_attention_for_cpu_backward.default in _targets(
        ex.backward)
    assert not ex.fallbacks


def _targets(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def test_math_kernel_with_a_query_masked_out_whole():
    # the math kernel's _safe_softmax gives zeros for such a row (eager's), not NaN
    fn = attention("bool_mask")
    q, k, v, mask = make_inputs("bool_mask", torch.float32, "cpu")
    mask[0, 0, 2] = False
    check_sdpa_inputs = [q, k, v, mask]
    eager = run(fn, check_sdpa_inputs, SDPBackend.MATH)
    ours = run(toycomp.compile(fn), check_sdpa_inputs, SDPBackend.MATH)
    assert not eager[0].isnan().any()
    for a, b in zip([ours[0], *ours[1]], [eager[0], *eager[1]]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", ["toycomp", "dynamo"])
def test_cpu_sdpa_under_autocast_bf16(path):
    torch.manual_seed(0)
    qkv, proj = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def block(x):
        q, k, v = qkv(x).view(2, 10, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return proj(y.transpose(1, 2).reshape(2, 10, 32))

    def autocast_block(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return block(x)

    x = torch.randn(2, 10, 32, requires_grad=True)
    eager = run(autocast_block, [x], SDPBackend.FLASH_ATTENTION)
    ours = run(compiled(autocast_block, path), [x], SDPBackend.FLASH_ATTENTION)
    assert ours[0].dtype == eager[0].dtype == torch.bfloat16
    qkv.double(), proj.double()
    reference = run(block, [x.double()], SDPBackend.MATH)
    for name, ref, lp, got in zip(["out", "grad_x"], [reference[0], *reference[1]],
                                  [eager[0], *eager[1]], [ours[0], *ours[1]]):  # fmt: skip
        atol, rtol = get_tolerances(ref, lp.to(torch.bfloat16))  # bf16's precision
        torch.testing.assert_close(got.double(), ref, atol=atol, rtol=rtol, msg=name)


# -- dropout: the random stream, the fraction dropped, the backward's mask ---------------------
def check_dropout(backend, path, device, p=0.3, seed=7):
    """Seeded: toycomp draws eager's numbers. Any draw: about ``p`` of the attention weights
    are dropped, and the backward drops the same ones as the forward (``v`` the identity)."""
    fn = attention("plain", dropout_p=p)
    gen = torch.Generator().manual_seed(0)
    q, k = [torch.randn(2, 4, n, 16, generator=gen).to(device).requires_grad_() for n in (6, 16)]
    v = torch.eye(16, device=device).expand(2, 4, 16, 16).clone().requires_grad_()
    torch.manual_seed(seed)
    try:
        eager = run(fn, [q, k, v], backend)
    except RuntimeError as e:
        pytest.skip(f"eager has no {backend.name} kernel with dropout: {str(e).splitlines()[0]}")
    fn_compiled = compiled(fn, path)
    torch.manual_seed(seed)
    ours = run(fn_compiled, [q, k, v], backend)
    for a, b in zip([ours[0], *ours[1]], [eager[0], *eager[1]]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    q, k, v = [x.detach().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel([backend]):
        out = fn_compiled(q, k, v)  # v = I: out is the dropped, rescaled attention matrix
        w = torch.randn_like(out)
        grad_v, = torch.autograd.grad((out * w).sum(), v)
    torch.testing.assert_close(grad_v, out.detach().transpose(-2, -1) @ w, rtol=1e-4, atol=1e-5)
    dropped = (out == 0).float().mean().item()  # softmax weights are never 0 themselves
    assert abs(dropped - p) < 0.08, dropped  # 768 weights: 5 standard deviations


@pytest.mark.parametrize("path", ["toycomp", "dynamo"])
@pytest.mark.parametrize("backend", CPU_BACKENDS, ids=lambda b: b.name)
def test_cpu_sdpa_dropout(backend, path):
    check_dropout(backend, path, "cpu")


# -- the CUDA kernels' results on the CPU: ints, None, RNG state (stand-ins) -------------------
def standin_call(kernel, dropout_p, bias=None):
    """A function calling ``kernel``'s ATen op directly (F.sdpa on the CPU cannot pick it)."""

    def flash(q, k, v):
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, True)[0]

    def efficient(q, k, v, *bias):
        return aten._scaled_dot_product_efficient_attention(q, k, v, *bias or [None], True,
                                                            dropout_p, not bias)[0]  # fmt: skip

    def cudnn(q, k, v, *bias):
        return aten._scaled_dot_product_cudnn_attention(q, k, v, *bias or [None], True,
                                                        dropout_p, not bias)[0]  # fmt: skip

    return {"flash": flash, "efficient": efficient, "cudnn": cudnn}[kernel]


@pytest.fixture
def standins():
    with cuda_attention_standins.registered():
        yield


def standin_inputs(lq=5, lk=7, e=8):
    gen = torch.Generator().manual_seed(0)
    shapes = [(2, 3, lq, e), (2, 3, lk, e), (2, 3, lk, e)]
    return [torch.randn(s, generator=gen).requires_grad_() for s in shapes]


def check_same_as_eager(fn, inputs, path, seed=3):
    torch.manual_seed(seed)
    eager = run(fn, inputs, SDPBackend.MATH)
    torch.manual_seed(seed)
    ours = run(compiled(fn, path), inputs, SDPBackend.MATH)
    for a, b in zip([ours[0], *ours[1]], [eager[0], *eager[1]]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("path", ["toycomp", "dynamo"])
@pytest.mark.parametrize("kernel", ["flash", "efficient", "cudnn"])
def test_cuda_kernel_results_reach_the_backward(standins, kernel, path, dropout_p):
    # with dropout, a backward given another seed than its forward's computes other gradients
    check_same_as_eager(standin_call(kernel, dropout_p), standin_inputs(), path)


def test_cuda_kernel_results_through_the_triton_backend(standins):
    # what CUDA runs: Triton's wrapper takes the ints, the Nones and the uint64 RNG state too
    for kernel in ["flash", "efficient", "cudnn"]:
        fn, inputs = standin_call(kernel, 0.3), standin_inputs()
        torch.manual_seed(3)
        eager = run(fn, inputs, SDPBackend.MATH)
        torch.manual_seed(3)
        ours = run(toycomp.compile(fn, backend="triton"), inputs, SDPBackend.MATH)
        for a, b in zip([ours[0], *ours[1]], [eager[0], *eager[1]]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel", ["efficient", "cudnn"])
def test_cuda_kernel_with_a_padded_mask(standins, kernel):
    # scaled_dot_product_attention pads a mask whose rows are not 8-aligned, then slices and
    # expands it (preprocess_mask): the kernel must get that layout, and the mask a gradient
    def fn(q, k, v, mask):
        lq, lk = mask.shape
        padded = F.pad(mask, (0, 8 - lk % 8))[..., :lk].expand(2, 3, lq, lk)
        return standin_call(kernel, 0.0)(q, k, v, padded)

    mask = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    mask.requires_grad_(kernel == "efficient")  # (cuDNN's backward gives the mask no gradient)
    check_same_as_eager(fn, [*standin_inputs(), mask], "toycomp")


@pytest.mark.parametrize("kernel", ["flash", "cudnn"])
def test_cuda_kernel_sequence_lengths_with_dynamic_shapes(standins, kernel):
    # max_q and max_k are SymInts: the backward takes them as sizes, for every length
    fn = standin_call(kernel, 0.0)
    compiled_fn = toycomp.compile(fn, dynamic=True)
    for lq, lk in [(5, 7), (9, 4), (12, 12)]:
        inputs = standin_inputs(lq, lk)
        eager, ours = run(fn, inputs, SDPBackend.MATH), run(compiled_fn, inputs, SDPBackend.MATH)
        for a, b in zip([ours[0], *ours[1]], [eager[0], *eager[1]]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert compiled_fn.compile_count == 1


def test_cudnn_backward_holds_the_lengths_and_gets_the_seed(standins):
    # [Note: results that are not tensors]: the ints are literals of the backward, the Nones
    # stay None; the seed and offset tensors are saved as the forward made them
    ex = toycomp.explain(standin_call("cudnn", 0.3), *standin_inputs(5, 7))
    backward, = [n for n in ex.backward.graph.nodes
                 if n.target is aten._scaled_dot_product_cudnn_attention_backward.default]
    assert backward.args[8:13] == (None, None, None, 5, 7)
    seed, offset = backward.args[6:8]
    assert seed.name in ex.saved_values and offset.name in ex.saved_values
    assert seed.meta["val"].shape == () and seed.meta["val"].dtype == torch.int64
    assert not ex.fallbacks


# -- CUDA (skipped without it; run on the lent GPU) ---------------------------------------------
cuda_only = pytest.mark.skipif(not CUDA, reason="needs CUDA")
CUDA_BACKENDS = [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.CUDNN_ATTENTION]  # fmt: skip
CUDA_SIZES = dict(b=2, h=4, lq=32, lk=48, e=64)


@cuda_only
@pytest.mark.parametrize("path", ["toycomp", "dynamo"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", CUDA_BACKENDS, ids=lambda b: b.name)
def test_cuda_sdpa(backend, dtype, variant, path):
    fn, inputs = check_sdpa(variant, dtype, backend, path, "cuda", **CUDA_SIZES)
    if path == "toycomp":  # the kernel forced is the one compiled, and nothing falls back
        targets, fallbacks = forward_targets(fn, inputs, backend)
        assert targets & SDPA_OPS == KERNEL_OPS[backend] & targets and not fallbacks, fallbacks
        assert (targets & SDPA_OPS) or backend is SDPBackend.MATH


@cuda_only
@pytest.mark.parametrize("path", ["toycomp", "dynamo"])
@pytest.mark.parametrize("backend", CUDA_BACKENDS, ids=lambda b: b.name)
def test_cuda_sdpa_dropout(backend, path):
    check_dropout(backend, path, "cuda")


@cuda_only
@pytest.mark.parametrize("path", ["toycomp", "dynamo"])
def test_cuda_sdpa_under_autocast_bf16(path):
    torch.manual_seed(0)
    qkv, proj = torch.nn.Linear(256, 768).cuda(), torch.nn.Linear(256, 256).cuda()

    def block(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            q, k, v = qkv(x).view(2, 64, 3, 4, 64).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
            return proj(y.transpose(1, 2).reshape(2, 64, 256))

    x = torch.randn(2, 64, 256, device="cuda", requires_grad=True)
    torch.manual_seed(1)
    eager = block(x)
    eager_grad, = torch.autograd.grad(eager.float().square().sum(), x)
    torch.manual_seed(1)
    ours = compiled(block, path)(x)
    grad, = torch.autograd.grad(ours.float().square().sum(), x)
    assert ours.dtype == eager.dtype == torch.bfloat16
    torch.testing.assert_close(ours, eager, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(grad, eager_grad, rtol=1.6e-2, atol=1e-2)


# -- AOT on real tensors ----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["dropout", "sdpa"])
def test_tracing_on_real_tensors_draws_no_random_numbers(op):
    # [Note: random ops draw nothing while tracing]: the first compiled call draws what eager's
    # first call draws (aot_function traces on the real tensors it is given)
    from toycomp.aot.aot_autograd import aot_function

    if op == "dropout":
        fn, inputs = (lambda x: F.dropout(x, 0.5) * 2), [torch.randn(64, requires_grad=True)]
    else:
        fn = attention("plain", dropout_p=0.5)
        inputs = make_inputs("plain", torch.float32, "cpu")
    torch.manual_seed(0)
    with sdpa_kernel([SDPBackend.MATH]):
        out, = aot_function(fn, inputs)(*inputs)
        torch.manual_seed(0)
        assert torch.equal(out, fn(*inputs))


@pytest.mark.parametrize("path", ["aot", "toycomp", "dynamo"])
def test_dropout_of_a_transposed_tensor_drops_what_eager_drops(path):
    # [Note: random ops draw in memory order]: bernoulli_ on empty_like of a transposed tensor
    # fills it in memory order; a contiguous bernoulli.p would put the numbers elsewhere
    from toycomp.aot.aot_autograd import aot_function

    def fn(x, w):
        return F.layer_norm(x + F.dropout((x @ w).transpose(0, 1), 0.3).transpose(0, 1), (8,))

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 3, 8, generator=gen), torch.randn(8, 8, generator=gen)
    inputs = [x.requires_grad_(), w.requires_grad_()]
    torch.manual_seed(0)
    ours_fn = aot_function(fn, inputs) if path == "aot" else compiled(fn, path)
    ours = run(lambda *a: ours_fn(*a)[0] if path == "aot" else ours_fn(*a), inputs, SDPBackend.MATH)
    torch.manual_seed(0)
    eager = run(fn, inputs, SDPBackend.MATH)
    for a, b in zip([ours[0], *ours[1]], [eager[0], *eager[1]]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", ["toycomp", "dynamo"])
def test_transformer_encoder_layer_training_step_with_dropout(path):
    # nn.MultiheadAttention's SDPA and dropout on the attention's transposed output (dropout1)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    x = torch.randn(2, 10, 32, requires_grad=True)
    params = [x, *layer.parameters()]

    def step(x):
        return layer(x).square().mean()

    torch.manual_seed(5)
    loss = compiled(step, path)(x)
    grads = torch.autograd.grad(loss, params)
    torch.manual_seed(5)
    loss_ref = step(x)
    for got, want in zip([loss, *grads], [loss_ref, *torch.autograd.grad(loss_ref, params)]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", ["toycomp", "dynamo"])
def test_dropout_of_a_transposed_tensor_with_dynamic_shapes(path):
    # the functionalised bernoulli_ reads a size input through as_strided: not an input whose
    # storage offset the wrapper checks (it is an int)
    def fn(x, w):
        return F.layer_norm(x + F.dropout((x @ w).transpose(0, 1), 0.3).transpose(0, 1), (8,))

    compiled_fn = toycomp.compile(fn, dynamic=True) if path == "toycomp" else (
        torch.compile(fn, backend="toycomp", dynamic=True))  # fmt: skip
    for n in (5, 7):
        inputs = [torch.randn(n, 3, 8).requires_grad_(), torch.randn(8, 8).requires_grad_()]
        torch.manual_seed(0)
        ours = run(compiled_fn, inputs, SDPBackend.MATH)
        torch.manual_seed(0)
        eager = run(fn, inputs, SDPBackend.MATH)
        for a, b in zip([ours[0], *ours[1]], [eager[0], *eager[1]]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
