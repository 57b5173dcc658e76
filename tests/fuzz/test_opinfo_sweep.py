"""OpInfo sweep: every ATen op toycomp decomposes goes through ``toycomp.compile`` on PyTorch's
own sample inputs (``op_db``), forward and backward, compared with eager.

Input -> output: ``DECOMPOSITIONS`` (the ATen overloads toycomp decomposes) -> the OpInfo
entries that reach them (by name, aten name, alias, or ``EXTRA_OPINFOS`` for backward-only and
renamed ops) -> for each, up to ``MAX_SAMPLES`` fp32 samples run through a function that calls
``info.op`` -> values and input gradients against eager by the fuzzer's tolerance rule. The C++
backend runs every entry; the Triton interpreter a representative subset (``TRITON_OPINFOS``).

An error is acceptable only when it names the unsupported op or construct (the fuzzer's
classification, tests/fuzz/programs.py); it is reported as a warning, as are samples where a
decomposition refused the case (its ATen op ran eagerly, visibly) and zeros of the other sign.
A failure prints a reproducer. Known failures are strict xfails in ``KNOWN_FAILURES``: a fix
makes them fail.

NB: PyTorch's equivalent is test/inductor/test_torchinductor_opinfo.py.
"""

from __future__ import annotations

import collections
import functools
import importlib
import math
import os
import pkgutil
import warnings
from typing import Any, Callable

import pytest
import torch

import toycomp
from tests.fuzz import programs

pytest.importorskip("expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

# Samples per OpInfo (CI time); TOYCOMP_SWEEP_SAMPLES=N overrides both, 0 runs every sample.
MAX_SAMPLES = int(os.environ.get("TOYCOMP_SWEEP_SAMPLES", 3)) or 10**9
TRITON_SAMPLES = int(os.environ.get("TOYCOMP_SWEEP_SAMPLES", 2)) or 10**9
# OpInfo ids (name, or name.variant) that also run on Triton's interpreter.
TRITON_OPINFOS = (
    "sin", "exp", "add", "mul", "div.no_rounding_mode", "where", "pow", "clamp", "sum", "mean",
    "amax", "softmax", "log_softmax", "native_layer_norm", "nn.functional.gelu", "transpose",
    "expand", "var", "nn.functional.batch_norm", "nn.functional.max_pool2d",
    # indirect indexing: loads, and scatters with tl.atomic_add
    "nn.functional.embedding", "index_select", "gather", "__getitem__", "index_put", "scatter",
    "scatter_add", "index_add", "constant_pad_nd", "flip", "roll", "cat", "narrow",
)

# (backend, OpInfo id) -> the failure's signature. Strict: delete an entry once it passes.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}

# ATen ops reached only through another OpInfo (backward formulas, private or renamed ops).
EXTRA_OPINFOS: dict[str, list[str]] = {
    "_embedding_bag": ["nn.functional.embedding_bag"],
    "_log_softmax_backward_data": ["log_softmax"],
    "_native_batch_norm_legit_functional": ["nn.functional.batch_norm"],
    "_native_batch_norm_legit_no_training": ["nn.functional.batch_norm"],
    "_softmax_backward_data": ["softmax"],
    "_to_copy": ["to", "double"],
    "_unsafe_view": ["reshape"],
    "avg_pool2d_backward": ["nn.functional.avg_pool2d"],
    "slice_backward": ["narrow"],
    "_unsafe_index": ["__getitem__"],
    "_unsafe_index_put": ["index_put"],
    "index": ["__getitem__"],
    "alias": ["alias_copy"],
    "elu_backward": ["nn.functional.elu"],
    "embedding_dense_backward": ["nn.functional.embedding"],
    "gelu_backward": ["nn.functional.gelu"],
    "hardsigmoid_backward": ["nn.functional.hardsigmoid"],
    "hardswish_backward": ["nn.functional.hardswish"],
    "hardtanh_backward": ["nn.functional.hardtanh"],
    "huber_loss_backward": ["nn.functional.huber_loss"],
    "leaky_relu_backward": ["nn.functional.leaky_relu"],
    "log_sigmoid_backward": ["nn.functional.logsigmoid"],
    "log_sigmoid_forward": ["nn.functional.logsigmoid"],
    "max_pool2d_with_indices": ["nn.functional.max_pool2d"],
    "mish_backward": ["nn.functional.mish"],
    "mse_loss_backward": ["nn.functional.mse_loss"],
    "native_batch_norm_backward": ["nn.functional.batch_norm", "native_batch_norm"],
    "native_group_norm": ["nn.functional.group_norm"],
    "native_group_norm_backward": ["nn.functional.group_norm"],
    "native_layer_norm": ["nn.functional.layer_norm"],
    "native_layer_norm_backward": ["native_layer_norm", "nn.functional.layer_norm"],
    "nll_loss_backward": ["nn.functional.nll_loss"],
    "nll_loss_forward": ["nn.functional.nll_loss"],
    "select_backward": ["select"],
    "sigmoid_backward": ["sigmoid"],
    "silu_backward": ["nn.functional.silu"],
    "smooth_l1_loss_backward": ["nn.functional.smooth_l1_loss"],
    "softplus_backward": ["nn.functional.softplus"],
    "tanh_backward": ["tanh"],
    "threshold_backward": ["nn.functional.relu"],
}
# Decomposed ATen ops with no OpInfo of their own; every compiled graph reaches most of them
# (detach in each backward, the _copy variants through functionalisation; lift_fresh through
# torch.tensor(...) in a function; all in tests/prims' test_identity_like_and_copies).
# _safe_softmax, the math attention's: tests/aot/test_sdpa.py (the capture cannot yet compile
# the SDPA OpInfo's op, torch.testing._utils.wrapper_set_seed(F.scaled_dot_product_attention)).
NO_OPINFO = {
    "copy", "detach", "detach_copy", "lift_fresh", "lift_fresh_copy", "select_copy",
    "slice_copy", "split_copy", "_safe_softmax",
}
# Ops whose result is uninitialised memory: compare shape, dtype and strides only.
UNINITIALISED = {"empty", "empty_like", "new_empty", "empty_strided"}


def decompositions() -> dict:
    """toycomp's DECOMPOSITIONS table, wherever in toycomp.prims it lives now."""
    try:
        return importlib.import_module("toycomp.prims.decompositions").DECOMPOSITIONS
    except (ImportError, AttributeError):
        pass
    import toycomp.prims  # noqa: PLC0415

    found = None
    for module in pkgutil.iter_modules(toycomp.prims.__path__):  # import all: rules register
        table = getattr(
            importlib.import_module(f"toycomp.prims.{module.name}"), "DECOMPOSITIONS", None
        )
        found = found if found is not None or table is None else table
    if found is None:
        raise ImportError("no toycomp.prims module defines DECOMPOSITIONS")
    return found


def _opinfo_id(info: Any) -> str:
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


@functools.lru_cache(maxsize=None)
def decomposed_op_names() -> frozenset[str]:
    """Names of the ATen ops with a decomposition ("sin", "_softmax", ...)."""
    table = decompositions()
    return frozenset(op.overloadpacket.__name__ for op in table if hasattr(op, "overloadpacket"))


def opinfos_by_aten_name() -> dict[str, list[Any]]:
    """ATen op name -> the OpInfo entries that reach it."""
    index: dict[str, list[Any]] = {}
    for info in op_db:
        for key in {info.name, info.aten_name, *(a.name for a in info.aliases)}:
            index.setdefault(key, []).append(info)
    found = {}
    for name in sorted(decomposed_op_names()):
        keys = [name, "nn.functional." + name, name.lstrip("_"), *EXTRA_OPINFOS.get(name, [])]
        infos = {_opinfo_id(i): i for k in keys for i in index.get(k, [])}
        if infos:
            found[name] = list(infos.values())
    return found


def _cases() -> list:
    infos = {_opinfo_id(i): i for group in opinfos_by_aten_name().values() for i in group}
    cases = []
    for backend in ("cpp", "triton", "cpp-teach"):  # cpp-teach: toycomp.config.teach on C++
        for key in sorted(infos):
            if backend == "triton" and key not in TRITON_OPINFOS:
                continue
            reason = KNOWN_FAILURES.get((backend.removesuffix("-teach"), key))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            cases.append(pytest.param(backend, infos[key], marks=marks, id=f"{backend}-{key}"))
    return cases


# --- one sample as a function of its tensors ---------------------------------------------------
class SampleFunction:
    """``fn(t0, t1, ...) = info.op(<sample's input, args, kwargs with tensors as t0, t1...>)``.

    Built from source text (tensors become parameters, everything else a named constant), so
    toycomp traces a plain call and the failure message can print that same text.
    """

    def __init__(self, info: Any, sample: Any) -> None:
        self.tensors: list[torch.Tensor] = []
        self.constants: dict[str, Any] = {"op": info.op}
        args = [self._expr(sample.input)] + [self._expr(a) for a in sample.args]
        args += [f"{k}={self._expr(v)}" for k, v in sample.kwargs.items()]
        params = ", ".join(f"t{i}" for i in range(len(self.tensors)))
        self.source = f"def fn({params}):\n    return op({', '.join(args)})\n"
        namespace = dict(self.constants)
        exec(compile(self.source, f"<opinfo {_opinfo_id(info)}>", "exec"), namespace)  # noqa: S102
        self.fn: Callable = namespace["fn"]

    def _expr(self, value: Any) -> str:
        if isinstance(value, torch.Tensor):
            self.tensors.append(value)
            return f"t{len(self.tensors) - 1}"
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            items = ", ".join(self._expr(v) for v in value)
            return f"[{items}]" if isinstance(value, list) else f"({items},)"
        name = f"c{len(self.constants) - 1}"
        self.constants[name] = value
        return name

    def describe(self) -> str:
        tensors = [f"t{i}: {tuple(t.shape)} {t.dtype} strides {t.stride()}"
                   f"{' requires_grad' if t.requires_grad else ''}"
                   for i, t in enumerate(self.tensors)]
        consts = [f"{k} = {v!r}" for k, v in self.constants.items() if k != "op"]
        return "\n".join(tensors + consts) + "\n" + self.source


def _flat(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _run(fn: Callable, tensors: list[torch.Tensor], phase: list[str]) -> tuple[list, list]:
    """(outputs, gradients of sum((out * w).sum()) wrt the inputs that require grad)."""
    phase[0] = "forward"
    outs = _flat(fn(*tensors))
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    wrt = [t for t in tensors if t.requires_grad]
    grads: list = []
    if diff and wrt:
        phase[0] = "backward"
        g = torch.Generator().manual_seed(0)
        loss = sum((o * (torch.rand(o.shape, generator=g) * 2 - 1).to(o.dtype)).sum() for o in diff)
        grads = list(torch.autograd.grad(loss, wrt, allow_unused=True))
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], grads


def _tolerances(results: list, exact: list | None, tensors: list) -> list:
    """The fuzzer's rule; L = largest / smallest numel among the sample's tensors."""
    sizes = [max(1, t.numel()) for t in tensors + results if isinstance(t, torch.Tensor)]
    accumulation = max(sizes) // min(sizes) if sizes else 1
    s = programs.tolerance_scale(accumulation)
    tols = []
    for k, e in enumerate(results):
        if isinstance(e, torch.Tensor) and not (e.is_floating_point() or e.is_complex()):
            tols.append((0.0, 0.0))  # integers and bools: exactly eager's (wrap-around too)
            continue
        if not isinstance(e, torch.Tensor) or not e.is_floating_point() or e.numel() == 0:
            tols.append((programs.RTOL * s, programs.ATOL * s))
            continue
        m = max(1.0, e.abs().nan_to_num(0, 0, 0).max().item()) if accumulation > 1 else 1.0
        atol = programs.ATOL * s * m
        e64 = exact[k] if exact is not None and k < len(exact) else None
        if isinstance(e64, torch.Tensor) and e64.shape == e.shape:
            err = (e.double() - e64.double()).abs().nan_to_num(0, 0, 0).max().item()
            atol = max(atol, 4 * err)
        tols.append((programs.RTOL * s, atol))
    return tols


def _in_fp64(fn: Callable, tensors: list[torch.Tensor]) -> list | None:
    doubled = [
        t.detach().double().requires_grad_(t.requires_grad) if t.dtype == torch.float32 else t
        for t in tensors
    ]
    try:
        return sum(_run(fn, doubled, ["fp64"]), [])
    except Exception:  # noqa: BLE001 - the fp64 run is only a hint for the tolerance
        return None


def check_sample(info: Any, sample: Any, backend: str) -> programs.Outcome:
    """Compile one sample's call, compare outputs and gradients with eager, classify."""
    f = SampleFunction(info, sample)
    outs, grads = _run(f.fn, f.tensors, ["eager"])
    expected = outs + grads
    tolerances = _tolerances(expected, _in_fp64(f.fn, f.tensors), f.tensors)
    phase = ["forward"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = toycomp.compile(f.fn, backend=backend)
        try:
            actual = sum(_run(compiled, f.tensors, phase), [])
        except Exception as e:  # noqa: BLE001 - classified
            return programs.classify_error(e, phase[0])
    if info.name in UNINITIALISED:
        got, want = [_layout(a) for a in actual], [_layout(e) for e in expected]
        if got != want:
            return programs.Outcome("wrong", "wrong metadata", f"{got} != {want} (eager)")
        return programs.Outcome("ok", "ok")
    wrong = _compare(actual, expected, len(outs), tolerances)
    if wrong is not None:
        return wrong
    eager = [str(w.message) for w in caught if "eagerly" in str(w.message)]
    if eager:
        return programs.Outcome("fallback", "fallback: " + programs.normalize(eager[0]))
    decomposed = {str(op) for op in decompositions()}
    refused = [f for f in aten_fallbacks(compiled) if f in decomposed]
    if refused:  # correct, but the decomposition refused this case and eager ran the op
        return programs.Outcome("fallback", f"decomposition refused: {', '.join(refused)}")
    return programs.Outcome("ok", "ok")


def aten_fallbacks(compiled: Any) -> list[str]:
    """ATen ops a compiled function left to eager (read defensively: not a public API)."""
    found = []
    for entry in getattr(compiled, "entries", []):
        for graph in getattr(entry, "graphs", []):
            found += [str(f) for f in getattr(graph, "fallbacks", [])]
    return sorted(set(found))


def _layout(t: torch.Tensor) -> tuple:
    """Shape, dtype and the strides that matter (dims of size > 1 of a non-empty tensor)."""
    strides = tuple(st for n, st in zip(t.shape, t.stride()) if n > 1) if t.numel() else ()
    return tuple(t.shape), t.dtype, strides


def _compare(
    actual: list, expected: list, n_outs: int, tolerances: list
) -> programs.Outcome | None:
    if len(actual) != len(expected):
        return programs.Outcome(
            "wrong", "wrong result count",
            f"{len(actual)} results != {len(expected)} (outputs + grads; a compiled output that "
            "does not require grad gives no grads)",
        )
    is_tensor = [isinstance(a, torch.Tensor) or isinstance(e, torch.Tensor)
                 for a, e in zip(actual, expected)]
    others = [(a, e) for a, e, t in zip(actual, expected, is_tensor) if not t]
    if any(a != e for a, e in others):
        return programs.Outcome("wrong", "wrong non-tensor result", repr(others))
    keep = [k for k, t in enumerate(is_tensor) if t]
    return programs.compare(
        [actual[k] for k in keep], [expected[k] for k in keep],
        sum(k < n_outs for k in keep), [tolerances[k] for k in keep],
    )


def all_samples(info: Any, dtype: torch.dtype | None = None) -> Any:
    """The OpInfo's samples, in order: fp32 (else int64, bool) unless ``dtype`` is given,
    requires_grad where it has autograd, global RNG seeded with 0 (so sample k is the same in
    every run)."""
    dtypes = info.supported_dtypes("cpu")
    if dtype is None:
        dtype = next((d for d in (torch.float32, torch.int64, torch.bool) if d in dtypes), None)
    if dtype is None or dtype not in dtypes:
        return iter(())
    torch.manual_seed(0)
    grad = info.supports_autograd and dtype.is_floating_point
    return info.sample_inputs("cpu", dtype, requires_grad=grad)


def sample_at(info: Any, index: int) -> Any:
    return next(s for k, s in enumerate(all_samples(info)) if k == index)


# [Note: which samples]
# The first `limit` samples (OpInfos list the ordinary cases first), then the first sample of
# each edge case below that is not among them: that is where compilers break (an empty tensor
# reaching a reduction without identity, an input that broadcasts up to the result's shape).
EDGE_CASES: dict[str, Callable[[Any], bool]] = {
    "zero-size tensor": lambda ts: any(0 in t.shape for t in ts),
    "0-dim input": lambda ts: bool(ts) and ts[0].dim() == 0,
    "input smaller than another tensor": lambda ts: any(t.numel() > ts[0].numel() for t in ts),
}


def samples(info: Any, limit: int) -> list[tuple[int, Any]]:
    """(index, sample) pairs: the first `limit` samples, then one per uncovered edge case."""
    found: list[tuple[int, Any]] = []
    missing = dict(EDGE_CASES)
    for k, sample in enumerate(all_samples(info)):
        tensors = _tensors_of(sample)
        hits = [name for name, test in missing.items() if test(tensors)]
        for name in hits:
            del missing[name]
        if k < limit or hits:
            found.append((k, sample))
        if k >= limit and not missing:
            break
    return found


def _tensors_of(sample: Any) -> list[torch.Tensor]:
    values = [sample.input, *sample.args, *sample.kwargs.values()]
    flat = [v for x in values for v in (x if isinstance(x, (list, tuple)) else [x])]
    return [t for t in flat if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("backend, info", _cases())
def test_opinfo(backend: str, info: Any) -> None:
    limit = MAX_SAMPLES if backend == "cpp" else TRITON_SAMPLES  # (teach: as Triton, fewer)
    preset = "teach" if backend.endswith("-teach") else "fast"
    backend = backend.removesuffix("-teach")
    failures, notes = [], collections.defaultdict(list)
    for k, sample in samples(info, limit):
        with toycomp.config.patch(**getattr(toycomp.config, preset)):
            outcome = check_sample(info, sample, backend)
        if outcome.cls in programs.FAILURES:
            failures.append((k, sample, outcome))
        elif outcome.cls in ("clear error", "fallback", "signed zero"):
            notes[f"{outcome.cls}: {outcome.signature}"].append(k)
    for note, ks in notes.items():  # not failures, but worth seeing in the summary
        warnings.warn(f"{_opinfo_id(info)} [{backend}] {note} (samples {ks})")
    if failures:
        k, sample, outcome = failures[0]
        others = "".join(f"\n  sample {j}: {o.cls}: {o.signature}" for j, _, o in failures[1:])
        pytest.fail(
            f"[preset {preset}] {outcome.cls}: {outcome.signature}\n{outcome.detail[:2500]}"
            f"{others}\n\n"
            f"Reproducer:\n{_reproducer(info, k, backend, SampleFunction(info, sample))}",
            pytrace=False,
        )


def _reproducer(info: Any, k: int, backend: str, f: SampleFunction) -> str:
    return (
        "import torch\n"
        "from torch.testing._internal.common_methods_invocations import op_db\n"
        "from tests.fuzz.test_opinfo_sweep import SampleFunction, check_sample, sample_at\n\n"
        f"info = next(o for o in op_db if (o.name, o.variant_test_name) == "
        f"({info.name!r}, {info.variant_test_name!r}))\n"
        f"sample = sample_at(info, {k})  # torch.manual_seed(0), fp32, requires_grad\n"
        "print(SampleFunction(info, sample).describe())  # what is compiled:\n"
        + "".join(f"#   {line}\n" for line in f.describe().splitlines())
        + f"print(check_sample(info, sample, {backend!r}))\n"
    )


def test_every_decomposed_op_is_swept() -> None:
    """Each decomposed ATen op has OpInfo samples, or is listed in NO_OPINFO with a reason."""
    missing = decomposed_op_names() - set(opinfos_by_aten_name()) - NO_OPINFO
    assert not missing, f"add these ATen ops to EXTRA_OPINFOS or NO_OPINFO: {sorted(missing)}"


def test_sample_function_names_tensors_and_constants() -> None:
    info = next(i for i in op_db if i.name == "add")
    sample = sample_at(info, 0)
    f = SampleFunction(info, sample)
    assert f.source.startswith("def fn(t0")
    assert len(f.tensors) >= 1
    assert math.isfinite(float(f.fn(*f.tensors).detach().sum()))


def test_check_sample_detects_a_wrong_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler that is off by 1e-3 is caught, in values and in gradients."""
    info = next(i for i in op_db if i.name == "sin")
    sample = sample_at(info, 0)
    off = _OffByOne()
    monkeypatch.setattr(toycomp, "compile", lambda fn, backend=None: off.wrap(fn))
    outcome = check_sample(info, sample, "cpp")
    assert (outcome.cls, outcome.signature) == ("wrong", "wrong values"), outcome


class _OffByOne:
    def wrap(self, fn: Callable) -> Callable:
        return lambda *args: fn(*args) + 1e-3


# --- variants: integer dtypes, other layouts, long reductions (C++) ----------------------------
# [Note: sweep variants]
# The fp32 sweep above sees each op on OpInfo's own (mostly contiguous, fp32) samples. Three
# more sweeps on the C++ backend, each over VARIANT_SAMPLES samples per OpInfo (one: the three
# take about 4 minutes on 2 cores, the fp32 sweep 1.3):
# * "int": one integer dtype per OpInfo among those it supports, rotating through uint8, int8,
#   int16, int32 and int64 over the OpInfos in name order (all five get covered, at the cost of
#   one); integer results must equal eager's exactly;
# * "channels_last": every 4-d (5-d) tensor of the sample in channels_last (_3d) order;
# * "noncontiguous": every tensor of 2+ dims with its last two dims' strides swapped, a 1-d one
#   as every other element of a buffer twice as long (same values, other strides).
# An OpInfo whose samples the variant leaves unchanged (no int dtype, no 4-d tensor) is skipped
# with that reason. Long reductions get a sample of their own (LONG_REDUCTIONS).
VARIANT_SAMPLES = int(os.environ.get("TOYCOMP_SWEEP_SAMPLES", 1)) or 10**9
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _layout_copy(t: Any, variant: str) -> Any:
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.numel() < 2:
        return t
    if variant == "channels_last" and t.dim() in (4, 5):
        fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        out = t.contiguous(memory_format=fmt)
    elif variant == "noncontiguous" and t.dim() >= 2 and min(t.shape[-2:]) > 1:
        out = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif variant == "noncontiguous" and t.dim() == 1:
        out = torch.empty(2 * t.numel(), dtype=t.dtype)[::2].copy_(t)
    else:
        return t
    return out.requires_grad_(t.requires_grad)


def variant_samples(info: Any, variant: str, int_dtype: torch.dtype) -> list[tuple[int, Any]]:
    """Up to VARIANT_SAMPLES samples of ``info`` changed by ``variant`` (see the Note)."""
    if variant == "int":
        return [(k, s) for k, s in enumerate(all_samples(info, int_dtype))][:VARIANT_SAMPLES]
    found = []
    for k, sample in enumerate(all_samples(info)):
        changed = sample.transform(lambda t: _layout_copy(t, variant))
        if any(a.stride() != b.stride() for a, b in zip(_tensors_of(sample), _tensors_of(changed))):
            found.append((k, changed))
        if len(found) == VARIANT_SAMPLES:
            break
    return found


def _variant_cases() -> list:
    infos = {_opinfo_id(i): i for group in opinfos_by_aten_name().values() for i in group}
    cases = []
    for n, key in enumerate(sorted(infos)):
        for variant in ("int", "channels_last", "noncontiguous"):
            reason = KNOWN_FAILURES.get((variant, key))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            dtype = INT_DTYPES[n % len(INT_DTYPES)]
            name = f"{variant}-{key}" + (f"-{str(dtype)[6:]}" if variant == "int" else "")
            cases.append(pytest.param(variant, infos[key], dtype, marks=marks, id=name))
    return cases


@pytest.mark.parametrize("variant, info, int_dtype", _variant_cases())
def test_opinfo_variant(variant: str, info: Any, int_dtype: torch.dtype) -> None:
    chosen = variant_samples(info, variant, int_dtype)
    if variant == "int" and not chosen:  # the op has no integer samples in this dtype
        others = [d for d in INT_DTYPES if d in info.supported_dtypes("cpu")]
        chosen = variant_samples(info, variant, others[0]) if others else []
    if not chosen:
        pytest.skip(f"no {variant} samples (no integer dtype, or no tensor it would change)")
    failures, ran = [], 0
    for k, sample in chosen:
        f = SampleFunction(info, sample)
        try:  # other layouts and dtypes than OpInfo's: eager itself may refuse them
            _run(f.fn, f.tensors, ["eager"])
        except Exception:  # noqa: BLE001
            continue
        ran += 1
        outcome = check_sample(info, sample, "cpp")
        if outcome.cls in programs.FAILURES:
            failures.append((k, sample, outcome))
    if not ran:
        pytest.skip(f"eager refuses the {variant} samples")
    if failures:
        k, sample, outcome = failures[0]
        pytest.fail(f"{variant} sample {k}: {outcome.cls}: {outcome.signature}\n"
                    f"{outcome.detail[:2500]}\n\n{SampleFunction(info, sample).describe()}",
                    pytrace=False)  # fmt: skip


# Long reductions: (OpInfo name, args after the input); the input is 2^20 uniform values in
# [0, 1) + 4 (a mean far from zero, where a sum drifts most), then compared by the tolerance
# rule, whose fp64 term is eager's own error.
LONG_REDUCTIONS = [
    ("sum", ()), ("mean", ()), ("var", ()), ("std", ()), ("amax", ()), ("softmax", (0,)),
    ("log_softmax", (0,)), ("logsumexp", (0,)), ("linalg.vector_norm", ()), ("prod", ()),
]  # fmt: skip


@pytest.mark.parametrize("name, args", LONG_REDUCTIONS, ids=[n for n, _ in LONG_REDUCTIONS])
def test_opinfo_long_reduction(name: str, args: tuple) -> None:
    from torch.testing._internal.opinfo.core import SampleInput  # noqa: PLC0415

    info = next((i for i in op_db if i.name == name and not i.variant_test_name), None)
    if info is None:
        pytest.skip(f"{name}: no OpInfo in this PyTorch")
    x = torch.rand(2**20, generator=torch.Generator().manual_seed(0)) + 4
    if name == "prod":
        x = 1 + (x - 4.5) * 1e-5  # a product near 1 that neither overflows nor vanishes
    sample = SampleInput(x.requires_grad_(), args=args)
    outcome = check_sample(info, sample, "cpp")
    assert outcome.cls not in programs.FAILURES, f"{outcome.signature}\n{outcome.detail[:2000]}"
