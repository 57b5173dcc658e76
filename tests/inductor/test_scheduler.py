"""Scheduling (fusion): kernel structure checked directly, values through the IR interpreter
against eager PyTorch."""

import sympy
import torch

from tests.inductor.test_lowering import compile_and_run, extern, kernels, trace_prims
import toycomp.prims as p
from toycomp.inductor import indexing, ir
from toycomp.inductor.interpret import run_lowered, run_scheduled
from toycomp.inductor.lowering import REALIZE_THRESHOLD
from toycomp.inductor.scheduler import schedule

aten = torch.ops.aten


def bcast_rows(v, shape):
    return p.broadcast_in_dim(v, shape, (0,))


def softmax(x):
    e = p.exp(p.sub(x, bcast_rows(p.amax(x, [1]), (8, 1000))))
    return p.div(e, bcast_rows(p.sum(e, [1]), (8, 1000)))


def log_softmax(x):
    shifted = p.sub(x, bcast_rows(p.amax(x, [1]), (8, 1000)))
    return p.sub(shifted, bcast_rows(p.log(p.sum(p.exp(shifted), [1])), (8, 1000)))


def loop_kinds(kernel):
    return [
        [type(s).__name__ + ("(r)" if loop.over_r else "") for s in loop.body]
        for loop in kernel.loops
    ]


def test_running_example_one_kernel():
    x = torch.randn(1000)
    f = lambda x: p.add(p.pow(p.sin(x), 2), p.pow(p.cos(x), 2))
    [k] = compile_and_run(f, x).steps
    assert (k.numel, k.rnumel) == (1000, 1) and loop_kinds(k) == [["Store"]]


def test_running_example_backward_one_kernel():
    x, g = torch.randn(1000), torch.randn(1000)

    def backward(x, g):  # d/dx (sin^2 + cos^2) * g = 2 sin cos g - 2 cos sin g
        a = p.mul(p.mul(p.mul(p.sin(x), 2.0), p.cos(x)), g)
        b = p.mul(p.mul(p.mul(p.cos(x), 2.0), p.sin(x)), g)
        return p.sub(a, b)

    scheduled = compile_and_run(backward, x, g)
    [k] = scheduled.steps
    assert (k.numel, k.rnumel) == (1000, 1) and k.reads() == ("arg0", "arg1")


def test_softmax_is_one_kernel():
    x = torch.randn(8, 1000)
    scheduled = compile_and_run(softmax, x)
    torch.testing.assert_close(run_scheduled(scheduled, [x])[0], torch.softmax(x, 1))
    [k] = scheduled.steps
    assert (k.numel, k.rnumel) == (8, 1000)
    assert loop_kinds(k) == [["Reduce(r)"], ["Reduce(r)"], ["Store(r)"]]
    assert [a.name for a in scheduled.allocations] == ["buf2"]  # amax and sum stay local
    assert k.buffer_dtypes == (("arg0", torch.float32), ("buf2", torch.float32))


def test_log_softmax_is_one_kernel():
    x = torch.randn(8, 1000)
    scheduled = compile_and_run(log_softmax, x)
    torch.testing.assert_close(run_scheduled(scheduled, [x])[0], torch.log_softmax(x, 1))
    [k] = scheduled.steps
    assert (k.numel, k.rnumel) == (8, 1000) and len(k.loops) == 3


def test_layer_norm_per_row_values_fuse_with_reductions():
    x = torch.randn(8, 1000)

    def layer_norm(x):
        mean = p.div(p.sum(x, [1]), 1000.0)
        centered = p.sub(x, bcast_rows(mean, (8, 1000)))
        var = p.div(p.sum(p.mul(centered, centered), [1]), 1000.0)
        rstd = p.rsqrt(p.add(var, 1e-5))
        return p.mul(centered, bcast_rows(rstd, (8, 1000))), mean, rstd

    scheduled = compile_and_run(layer_norm, x)
    [k] = scheduled.steps
    assert loop_kinds(k) == [["Reduce(r)"], ["Reduce(r)"], ["Store(r)"], ["Store", "Store"]]
    out = run_scheduled(scheduled, [x])[0]
    expected = torch.nn.functional.layer_norm(x, (1000,))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_sum_over_dim0():
    x = torch.randn(32, 10)
    scheduled = compile_and_run(lambda x: p.sum(x, [0]), x)
    [k] = scheduled.steps
    assert (k.numel, k.rnumel) == (10, 32)
    [reduce] = k.loops[0].body
    assert reduce.value.index == indexing.x + 10 * indexing.r


def test_sum_over_middle_dim_and_reduction_to_scalar():
    x = torch.randn(4, 5, 6)
    scheduled = compile_and_run(lambda x: (p.sum(x, [1]), p.amax(x, [0, 1, 2])), x)
    shapes = [(k.numel, k.rnumel) for k in kernels(scheduled)]
    assert shapes == [(24, 5), (1, 120)]
    x2 = torch.randn(3, 7)
    [k] = compile_and_run(lambda x: p.sqrt(p.sum(p.mul(x, x), [0, 1])), x2).steps
    assert (k.numel, k.rnumel) == (1, 21)


def test_pointwise_producer_fuses_into_reduction_and_is_stored_once():
    x = torch.randn(16, 4, 25)  # reduce dims (1, 2): rows of 100 split over two dims

    def f(x):
        y = x
        for _ in range(REALIZE_THRESHOLD):  # big and used twice: realized before the sum
            y = p.sin(y)
        return y, p.sum(y, [1, 2])

    scheduled = compile_and_run(f, x)
    [k] = scheduled.steps
    assert (k.numel, k.rnumel) == (16, 100)
    assert loop_kinds(k) == [["Store(r)", "Reduce(r)"], ["Store"]]


def test_reshaped_rows_fuse_into_reduction():
    x = torch.randn(8, 1000)

    def f(x):
        y = p.reshape(p.exp(x), [8, 10, 100])
        return p.sum(p.reshape(y, [8, 1000]), [1]), y

    scheduled = compile_and_run(f, x)
    [k] = scheduled.steps
    [store_y] = [s for loop in k.loops for s in loop.body if getattr(s, "buffer", "") == "buf1"]
    assert store_y.index == 1000 * indexing.x + indexing.r


def test_transposed_read_of_a_full_buffer_starts_a_new_kernel():
    x = torch.randn(30, 20)

    def f(x):
        y = x
        for _ in range(REALIZE_THRESHOLD):  # big and used twice: realized as buf0
            y = p.sin(y)
        return p.add(p.permute(y, [1, 0]), 1.0), p.mul(y, 2.0)

    scheduled = compile_and_run(f, x)
    assert len(kernels(scheduled)) == 2  # y and y * 2 fuse; the transposed read cannot
    assert kernels(scheduled)[1].reads() == ("buf0",)
    assert [a.name for a in scheduled.allocations] == ["buf0", "buf2", "buf1"]


def test_hand_made_ir_transposed_read():
    y = ir.Pointwise("buf0", (30, 20), torch.float32, _load("x", 20, 1))
    neg = ir.Op("neg", (_load("buf0", 1, 20),), torch.float32)
    t = ir.Pointwise("buf1", (20, 30), torch.float32, neg)
    graph = ir.LoweredGraph(
        (ir.InputBuffer("x", (30, 20), (20, 1), torch.float32),),
        (y, t),
        (ir.TensorArg("buf1", (20, 30), (30, 1)),),
        torch.device("cpu"),
    )
    scheduled = schedule(graph)
    assert len(scheduled.steps) == 2 and [a.name for a in scheduled.allocations] == ["buf0", "buf1"]
    x = torch.randn(30, 20)
    torch.testing.assert_close(run_scheduled(scheduled, [x])[0], -x.t())
    torch.testing.assert_close(run_lowered(graph, [x])[0], -x.t())


def test_reduction_broadcast_along_the_other_dim_is_not_fused():
    x = torch.randn(8, 8)
    f = lambda x: p.add(x, p.broadcast_in_dim(p.sum(x, [1]), (8, 8), (1,)))  # x[i,j] + s[j]
    scheduled = compile_and_run(f, x)
    assert [(k.numel, k.rnumel) for k in scheduled.steps] == [(8, 8), (64, 1)]
    assert [a.name for a in scheduled.allocations] == ["buf0", "buf1"]


def test_extern_splits_kernels_and_its_inputs_are_stored():
    x, w = torch.randn(4, 8), torch.randn(8, 8)

    def f(x, w):
        h = p.tanh(x)
        m = extern(aten.mm.default, h, w)
        return p.add(m, h), p.sum(m, [1])

    scheduled = compile_and_run(f, x, w)
    assert [type(s).__name__ for s in scheduled.steps] == ["Kernel", "ExternKernel", "Kernel"]
    assert scheduled.steps[2].rnumel == 8  # add(m, h) fused into the row sum's kernel
    assert [a.name for a in scheduled.allocations] == ["buf0", "buf2", "buf3"]


def test_horizontal_fusion_of_outputs_sharing_reads():
    x = torch.randn(100)
    scheduled = compile_and_run(lambda x: (p.sin(x), p.cos(x), p.mul(x, 2.0)), x)
    [k] = scheduled.steps
    assert k.writes() == ("buf0", "buf1", "buf2") and k.reads() == ("arg0",)


def test_int_and_bool_kernels():
    x = torch.randint(0, 10, (6, 9))

    def f(x):
        row_sums = p.broadcast_in_dim(p.sum(x, [1]), (6, 9), (0,))
        return p.where(p.gt(x, 4), row_sums, x), p.logical_not(p.eq(x, 3))

    [k] = compile_and_run(f, x).steps
    assert dict(k.buffer_dtypes) == {"arg0": torch.int64, "buf1": torch.int64, "buf2": torch.bool}


# --- helpers -------------------------------------------------------------------------------------
def _load(buffer, *strides):
    ivars = indexing.index_vars("i", len(strides))
    return ir.Load(buffer, sympy.Add(*(s * i for s, i in zip(strides, ivars))), torch.float32)


# --- random prim programs: lowering + fusion must agree with eager on all of them -----------------
def _random_program(rng, shape):
    """A list of (op, args) steps over value numbers 0 (x) and 1 (y), and the outputs."""
    shapes, steps = [shape, shape], []

    def add(step, out_shape):
        steps.append(step)
        shapes.append(out_shape)

    for _ in range(rng.randint(3, 20)):
        k = rng.randrange(len(shapes))
        s, choice = shapes[k], rng.random()
        if choice < 0.2 or not s:
            add(("unary", rng.choice(["sin", "exp", "neg", "tanh"]), k), s)
        elif choice < 0.4:
            same = [j for j, t in enumerate(shapes) if t == s]
            add(("binary", rng.choice(["add", "mul", "maximum"]), k, rng.choice(same)), s)
        elif choice < 0.6:
            dims = sorted(rng.sample(range(len(s)), rng.randint(1, len(s))))
            add(("normalize", rng.choice(["sum", "amax", "amin"]), k, dims), s)
        elif choice < 0.7:
            dims = sorted(rng.sample(range(len(s)), rng.randint(1, len(s))))
            add(("reduce", rng.choice(["sum", "amax"]), k, dims), tuple(
                n for d, n in enumerate(s) if d not in dims))  # fmt: skip
        elif choice < 0.8:
            perm = rng.sample(range(len(s)), len(s))
            add(("permute", k, perm), tuple(s[d] for d in perm))
        elif choice < 0.9:
            d = rng.randrange(len(s))
            start, step = rng.randrange(s[d]), rng.randint(1, 2)
            end = rng.randint(start + 1, s[d])
            n = len(range(start, end, step))
            add(("slice", k, d, start, end, step), s[:d] + (n,) + s[d + 1 :])
        else:
            add(("reshape", k, [indexing.numel(s)]), (indexing.numel(s),))
    return steps, shapes, sorted({rng.randrange(len(shapes)) for _ in range(rng.randint(1, 3))})


def _run_program(steps, shapes, outs, x, y):
    env = [x, y]
    for op, *args in steps:
        if op == "unary":
            env.append(getattr(p, args[0])(env[args[1]]))
        elif op == "binary":
            env.append(getattr(p, args[0])(env[args[1]], env[args[2]]))
        elif op == "normalize":  # v - reduce(v) broadcast back: softmax-like row patterns
            name, k, dims = args
            kept = [d for d in range(len(shapes[k])) if d not in dims]
            r = p.broadcast_in_dim(getattr(p, name)(env[k], dims), shapes[k], kept)
            env.append(p.sub(env[k], r))
        elif op == "reduce":
            env.append(getattr(p, args[0])(env[args[1]], args[2]))
        else:
            env.append(getattr(p, op)(env[args[0]], *args[1:]))
    return tuple(env[o] for o in outs)


def test_random_prim_programs_match_eager():
    import random

    for seed in range(40):
        rng = random.Random(seed)
        shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 3)))
        x = torch.randn(shape[::-1]).permute(*reversed(range(len(shape))))  # non-contiguous
        steps, shapes, outs = _random_program(rng, shape)
        compile_and_run(lambda x, y: _run_program(steps, shapes, outs, x, y), x, torch.randn(shape))


def test_multi_output_extern_is_one_step_and_only_live_outputs_matter():
    from toycomp.inductor.scheduler import format_scheduled
    from toycomp.inductor.wrapper import compile_graph

    x = torch.randn(6, 5)
    sort = ir.ExternKernel(
        "buf0", "aten.sort.default", (ir.TensorArg("x", (6, 5), (5, 1)), 1), (), (), (),
        torch.float32, fallback=True, outputs=(
            ir.MultiOutput("buf0_0", 0, (6, 5), (5, 1), torch.float32),
            ir.MultiOutput("buf0_1", 1, (6, 5), (5, 1), torch.int64),
        ),
    )  # fmt: skip
    dead = ir.Pointwise("buf1", (6, 5), torch.float32, _load("x", 5, 1))  # nothing reads it
    exp_body = ir.Op("exp", (_load("buf0_0", 5, 1),), torch.float32)
    exp = ir.Pointwise("buf2", (6, 5), torch.float32, exp_body)
    graph = ir.LoweredGraph(
        (ir.InputBuffer("x", (6, 5), (5, 1), torch.float32),),
        (sort, dead, exp),
        (ir.TensorArg("buf2", (6, 5), (5, 1)),),
        torch.device("cpu"),
    )
    scheduled = schedule(graph)
    assert [type(s).__name__ for s in scheduled.steps] == ["ExternKernel", "Kernel"]
    assert [a.name for a in scheduled.allocations] == ["buf2"]
    assert "buf0_0 = buf0[0]" in format_scheduled(scheduled)
    for backend in ("cpp", "triton"):
        (out,) = compile_graph(scheduled, backend)([x])
        torch.testing.assert_close(out, x.sort(1).values.exp())
