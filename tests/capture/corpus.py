"""A corpus of small functions for the bytecode capture (toycomp/capture/convert_frame.py).

Each ``Case`` is a function, the argument tuples of several calls, and optionally a hook run
before each call (``before(i)``: change a global, switch a module to eval mode...) and the Python
state to compare with eager (``state()``). tests/capture/test_corpus.py runs every case eagerly and
compiled and compares outputs, gradients, state, printed text and mutated inputs after each call.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Case:
    fn: Callable
    calls: Callable[[], list[tuple]]  # fresh argument tuples, one per call
    before: Callable[[int], None] | None = None
    state: Callable[[], Any] | None = None
    reset: Callable[[], None] | None = None
    grad: bool = False  # also compare gradients of the inputs
    dynamo_differs: str | None = None  # why graph_count may differ from Dynamo's
    whole_frame: bool = False  # Dynamo compiles it with no graph break: toycomp must too


CASES: dict[str, Case] = {}


def case(calls, **kw):
    def register(fn):
        CASES[fn.__name__] = Case(fn, calls, **kw)
        return fn
    return register


def t(*shape, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    return x.requires_grad_(grad)


def three(*shape, grad=False):
    return lambda: [(t(*shape, seed=i, grad=grad),) for i in range(3)]


# ----- straight-line code, Python arithmetic, loops, containers ------------------------------

@case(three(8, grad=True), grad=True)
def straight_line(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


@case(three(4))
def python_arithmetic(x):
    k = (2 + 3) * 4 // 3 - 1 % 2
    return x * k / 2 ** 3 + abs(-1.5)


@case(lambda: [(t(3), 2), (t(3, seed=1), 2), (t(3, seed=2), 4)])
def loop_range_int(x, n):
    for i in range(n):
        x = x + i
    return x


@case(lambda: [([t(3, seed=i), t(3, seed=i + 1)],) for i in range(3)])
def loop_over_list(xs):
    total = torch.zeros(3)
    for x in xs:
        total = total + x
    return total


@case(three(3))
def enumerate_and_zip(x):
    ys = [x, x * 2, x * 3]
    out = []
    for i, (a, b) in enumerate(zip(ys, reversed(ys))):
        out.append(a * i + b)
    return out


@case(three(2, 3))
def tuples_and_unpacking(x):
    a, b = x.unbind(0)
    first, *rest = (a, b, a + b)
    return first, len(rest), rest[-1]


@case(lambda: [({"a": t(3, seed=i), "b": t(3, seed=i + 5)},) for i in range(3)])
def dict_argument(d):
    return d["a"] * d.get("b") + sum(v.sum() for v in d.values())


@case(three(3))
def dict_result(x):
    d = {"double": x * 2}
    d["square"] = x * x
    d.update(neg=-x)
    return {k: v + 1 for k, v in d.items()}


@case(three(4))
def while_loop_python_counter(x):
    i = 0
    while i < 3:
        x = x * 0.5
        i += 1
    return x, i


@case(three(3))
def comprehension_over_tensors(x):
    parts = [x * k for k in range(3) if k != 1]
    return torch.stack(parts), {k: k * k for k in range(3)}


@case(lambda: [(t(3), "relu"), (t(3, seed=1), "tanh"), (t(3, seed=2), "relu")],
      whole_frame=True)
def string_dispatch(x, kind):
    name = f"act_{kind.upper()}"
    if name.endswith("RELU"):
        return torch.relu(x), name
    return torch.tanh(x), name[4:]


@case(three(2, 3))
def isinstance_and_shapes(x):
    assert isinstance(x, torch.Tensor)
    n = x.shape[0] * x.size(1) + x.dim() + len(x)
    if isinstance(n, int) and x.dtype == torch.float32:
        return x.reshape(-1) * n, x.shape
    return x


@case(three(3))
def min_max_len_on_constants(x):
    sizes = [4, 1, 3]
    return x * max(sizes) + min(sizes) - len(sizes), sorted(sizes)


# ----- closures, globals, helpers, kwargs ------------------------------------------------------

def make_scaler(scale):
    def scaler(x):
        return x * scale
    return scaler


SCALER = make_scaler(3.0)


@case(three(3))
def closure_from_outside(x):
    return SCALER(x) + 1


def make_closure_fn():
    offset = torch.ones(3)
    bias = 0.5

    def closure_in_frame(x):
        return x + offset * bias
    return closure_in_frame


CASES["closure_cells"] = Case(make_closure_fn(), three(3))


@case(three(3))
def inner_function_and_lambda(x):
    k = 3

    def inner(y):
        return y * k

    square = lambda y: y * y  # noqa: E731
    return inner(x) + square(x)


SCALE = 2.0
W = torch.randn(3)


def _set_scale(i):
    global SCALE
    SCALE = [2.0, 2.0, 5.0][i]


@case(three(3), before=_set_scale)
def global_constant_changes(x):
    return x * SCALE + W


HELPER_K = 1.0


def helper(x, k=2):
    return x * k + HELPER_K


def _set_helper_k(i):
    global HELPER_K
    HELPER_K = [1.0, 7.0, 7.0][i]


@case(three(3), before=_set_helper_k)
def inlined_helper_reads_global(x):
    return helper(x) + helper(x, k=3)


class KW(dict):
    """Keyword arguments of a call, as the last item of its argument tuple."""


@case(lambda: [(t(3),), (t(3, seed=1), 3.0), (t(3, seed=2), 3.0, KW(flip=True, beta=2.0))])
def defaults_and_kwargs(x, alpha=1.0, flip=False, *, beta=0.5):
    y = x * alpha + beta
    return -y if flip else y


@case(lambda: [(t(3), t(3, seed=1)), (t(3, seed=2), t(3, seed=3), t(3, seed=4), KW(scale=2.0))])
def star_args(*xs, **opts):
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    return total * opts.get("scale", 1.0)


def _call_with_kwargs(*args, **kwargs):
    return args, kwargs


@case(three(3))
def forwarding_star_kwargs(x):
    args, kwargs = _call_with_kwargs(x, 2, scale=3, shift=x)
    return args[0] * kwargs["scale"] + kwargs["shift"] * args[1]


# ----- objects and modules -----------------------------------------------------------------------

class Scaler:
    def __init__(self, k):
        self.k = k
        self.calls = 0

    def apply(self, x):
        return x * self.k

    @property
    def double_k(self):
        return self.k * 2


OBJ = Scaler(2.0)


@case(three(3), state=lambda: OBJ.calls, reset=lambda: setattr(OBJ, "calls", 0))
def methods_properties_and_setattr(x):
    OBJ.calls += 1
    return OBJ.apply(x) + OBJ.double_k


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(4, 8), nn.Linear(8, 4)])
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(4, 2))
        self.scale = 2.0
        self.act = F.relu

    def forward(self, x):
        for layer in self.layers:
            x = self.act(layer(x))
        return self.head(x) * self.scale


MODEL = MLP()


@case(lambda: [(MODEL, t(5, 4), torch.tensor([0, 1, 1, 0, 1])) for _ in range(3)])
def module_as_argument(model, x, y):
    return F.cross_entropy(model(x), y)


def _tweak_model(i):
    MODEL.scale = [2.0, 10.0, 10.0][i]
    MODEL.act = [F.relu, F.relu, torch.tanh][i]


@case(three(5, 4), before=_tweak_model, reset=lambda: _tweak_model(0))
def module_attributes_change(x):
    return MODEL(x)


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.blocks = nn.ModuleDict({"a": nn.Linear(3, 3), "b": nn.Linear(3, 3)})
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        for name, block in self.blocks.items():
            x = block(x) + (1.0 if name == "a" else 0.0)
        return self.bn(x)


BLOCKS = Blocks()
_BLOCKS_STATE = copy.deepcopy(BLOCKS.state_dict())


def _reset_blocks():
    BLOCKS.load_state_dict(_BLOCKS_STATE)
    BLOCKS.train()


def _eval_on_last(i):
    BLOCKS.train(i < 2)


@case(three(4, 3), before=_eval_on_last, reset=_reset_blocks,
      state=lambda: BLOCKS.bn.running_mean.clone())
def model_eval_between_calls(x):
    return BLOCKS(x)


class Base(nn.Module):
    def forward(self, x):
        return x + 1


class Child(Base):
    def forward(self, x):
        return super().forward(x) * 2


CHILD = Child()


@case(three(3))
def super_call(x):
    return CHILD(x)


@case(three(4, grad=True), grad=True)
def grads_through_module_parameters(x):
    return (MODEL(x.expand(2, 4)) ** 2).sum()


# ----- side effects ----------------------------------------------------------------------------

LOG: list = []
COUNT = 0
STATS: dict = {}


def _reset_effects():
    global COUNT
    LOG.clear()
    STATS.clear()
    COUNT = 0


def _effects():
    return list(LOG), COUNT, dict(STATS)


@case(three(3), state=_effects, reset=_reset_effects)
def global_list_append(x):
    LOG.append(1)
    LOG.append(f"call {len(LOG)}")
    return x + 1


@case(three(3), state=_effects, reset=_reset_effects)
def global_counter_used_in_result(x):
    global COUNT
    COUNT += 1
    return x * COUNT


@case(three(3), state=_effects, reset=_reset_effects)
def global_dict_update(x):
    STATS["calls"] = STATS.get("calls", 0) + 1
    STATS.update(last="f")
    return x.cos()


@case(lambda: [(t(3, seed=i), [1, 2]) for i in range(3)])
def mutate_list_argument(x, acc):
    acc.append(len(acc))
    acc[0] = 10
    return x * acc[-1]


@case(three(3), state=_effects, reset=_reset_effects)
def new_list_stored_in_global(x):
    global COUNT
    items = [1, 2]
    items.append(3)
    LOG.append(items)
    COUNT = len(items)
    return x * 2, items


# ----- graph breaks ----------------------------------------------------------------------------

@case(three(3))
def print_breaks(x):
    y = x.sin()
    print("y has shape", y.shape, "and", 3, "items")
    return y.cos()


@case(lambda: [(t(3, seed=i) * (1 if i != 1 else -10),) for i in range(3)])
def break_on_tensor_value(x):
    y = x * 2
    if y.sum() > 0:
        return y.sin()
    return y.cos()


@case(three(3))
def item_breaks(x):
    y = x.sum()
    scale = y.item()
    return x * scale


@case(three(3))
def tolist_breaks(x):
    values = x.tolist()
    return x * len(values) + values[0]


@case(three(3))
def numpy_call_breaks(x):
    y = x.exp()
    k = np.sqrt(4.0)
    return y * float(k)


def _helper_with_print(y):
    z = y * 3
    print("inside the helper")
    return z + 1


@case(three(3))
def break_inside_helper(x):
    a = x.sin()
    b = _helper_with_print(a)
    return b.cos()


@case(lambda: [(t(3, seed=i), torch.tensor(i % 2)) for i in range(3)])
def index_with_0d_tensor(x, i):
    options = [x.sin(), x.cos()]
    return options[i] * 2


@case(three(3))
def random_random_is_not_frozen(x):
    return x * random.random()


@case(three(3))
def break_in_loop(x):
    for i in range(2):
        x = x + 1
        print("step", i)
    return x


# ----- grad mode, autocast, in-place, aliasing --------------------------------------------------

@case(three(3, grad=True), grad=True)
def no_grad_inside(x):
    with torch.no_grad():
        y = x * 2
    return x * y


@case(lambda: [(t(4, 4, seed=i),) for i in range(3)])
def autocast_inside(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
    return y.float() + 1, y.dtype


@case(three(3))
def in_place_update_of_input(x):
    x.add_(1)
    x[0] = 5.0
    return x * 2


def _aliased_calls():
    a = t(3)
    return [(t(3), t(3, seed=1)), (a, a), (t(3, seed=2), t(3, seed=3))]


@case(_aliased_calls)
def aliased_arguments(a, c):
    a.add_(1)
    return c * 2


def _views_of_one_tensor():
    a, b = t(4), t(6, seed=1)
    return [(t(3), t(3, seed=1)), (a, a.view(-1)), (b[:3], b[2:5]), (a, a), (t(3, seed=2), t(3))]


@case(_views_of_one_tensor)
def aliased_views_in_place(a, c):
    a.mul_(2)
    c.add_(1)
    return a + c, c.sum()


@case(three(3), dynamo_differs="Dynamo traces NumPy on tensors (torch._numpy); toycomp breaks")
def numpy_on_tensor_data_breaks(x):
    y = x * 2
    z = np.asarray(y.detach().numpy()).sum()
    return y + float(z)


@case(three(3))
def generator_expression(x):
    return sum(x * k for k in range(3)) + max(k * k for k in (1, 2))


@case(three(3, grad=True), grad=True)
def break_inside_no_grad(x):
    y = x * 2
    with torch.no_grad():
        z = y * 3
        print("inside no_grad", z.requires_grad)
        w = z + 1
    return y * w, w.requires_grad, torch.is_grad_enabled()


@case(three(3))
def break_inside_try_skips_frame(x):
    try:
        y = x.sin()
        print("in try")
    except RuntimeError:
        y = x
    return y.cos()


@case(lambda: [(t(3), None), (t(3, seed=1), t(3, seed=2)), (t(3, seed=3), None)])
def optional_argument_and_identity(x, bias):
    if bias is None:
        bias = x
    same = bias is x
    return x * 2 + bias, same


# ----- graph breaks inside with blocks and try blocks (Dynamo re-enters the with blocks) ------

@case(lambda: [(t(4, 4, seed=i),) for i in range(3)])
def break_inside_autocast(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
        print("inside autocast", y.dtype, torch.is_autocast_enabled("cpu"))
        z = y @ x
    return z.float(), z.dtype, torch.is_autocast_enabled("cpu")


@case(lambda: [(t(3, 3, seed=i, grad=True),) for i in range(3)], grad=True)
def break_inside_nested_contexts(x):
    with torch.no_grad():
        y = x * 2
        with torch.enable_grad():
            z = x * y
            print("grad on inside no_grad:", torch.is_grad_enabled())
            w = z.sin()
        v = w * 3
    return w + v, v.requires_grad, torch.is_grad_enabled()


@case(lambda: [(t(3, seed=i, grad=True), i != 1) for i in range(3)], grad=True)
def break_inside_set_grad_enabled(x, flag):
    y = x.cos()
    with torch.set_grad_enabled(flag):
        z = y * x
        print("grad mode", torch.is_grad_enabled())
        w = z.exp()
    return w + y, w.requires_grad


@case(lambda: [(t(4, 4, seed=i),) for i in range(3)])
def helper_breaks_inside_autocast(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = _helper_with_print(x @ x)
    return y.float() * 2, y.dtype


@case(lambda: [(t(3, seed=i) * (1 if i != 1 else -10),) for i in range(3)])
def jump_on_tensor_inside_no_grad(x):
    with torch.no_grad():
        y = x * 2
        if y.sum() > 0:
            z = y.sin()
        else:
            z = y.cos()
    return z + 1, torch.is_grad_enabled()


@case(three(3))
def break_in_try_after_two_ops(x):
    y = x.sin()
    z = y.cos()
    try:
        w = z * 2
        print("in try")
    except RuntimeError:
        w = z
    return w.exp()


@case(three(3))
def break_in_try_finally_around_with(x):
    y = x.sin()
    z = y.cos()
    try:
        with torch.no_grad():
            w = z * 2
            print("with inside try")
    finally:
        w = w + 1
    return w.exp()


@case(lambda: [(t(3, seed=i), i) for i in range(3)])
def exception_caught_in_try(x, n):
    y = x.sin()
    z = y.cos()
    try:
        w = z * 2
        if n == 1:
            raise ValueError("n is one")
        w = w + n
    except ValueError as e:
        w = z - len(str(e))
    finally:
        w = w * 3
    return w.exp()


@case(three(3), dynamo_differs="Dynamo raises the fake tensor's shape error instead of running "
      "the except handler (toycomp: compiled up to the try, the rest eagerly)")
def break_in_except_handler(x):
    y = x.sin()
    z = y.cos()
    try:
        w = z + torch.ones(4)  # raises: shapes (3,) and (4,) do not broadcast
    except RuntimeError:
        print("caught the shape error")
        w = z
    return w * 2


# ----- objects of user classes made inside the function ----------------------------------------

class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y
        self.moves = 0

    def norm(self):
        return (self.x ** 2 + self.y ** 2).sqrt()

    def move(self, dx):
        self.x = self.x + dx
        self.moves += 1
        return self

    @property
    def total(self):
        return self.x + self.y


class Point3(Point):
    def __init__(self, x, y, z):
        super().__init__(x, y)
        self.z = z

    def norm(self):
        return (super().norm() ** 2 + self.z ** 2).sqrt()


@case(lambda: [(t(3, seed=i), t(3, seed=i + 3)) for i in range(3)])
def new_object_attributes_and_methods(a, b):
    p = Point(a, b)
    p.move(1.0).move(a)
    return p.norm() * p.moves + p.total, isinstance(p, Point)


@case(lambda: [(t(3, seed=i, grad=True), t(3, seed=i + 3)) for i in range(3)], grad=True)
def new_object_returned_and_in_a_list(a, b):
    p = Point3(a.sin(), b, a * b)
    q = Point(p.norm(), 2.0)
    pts = [p, q]
    return pts, q, pts[0].z


POINTS: list = []


@dataclass
class Pair:
    a: torch.Tensor
    b: float = 2.0
    tags: list = field(default_factory=list)

    def scaled(self):
        return self.a * self.b


@case(three(3), state=lambda: [(p.a.clone(), p.b, list(p.tags)) for p in POINTS],
      reset=POINTS.clear)
def new_dataclass_stored_in_a_global_list(x):
    pair = Pair(x.cos())
    pair.tags.append("made")
    POINTS.append(pair)
    return pair.scaled() + len(POINTS)


@case(three(3), dynamo_differs="Dynamo 2.13 never starts tracing the resume function when an "
      "object made in the frame is live across the break (1 graph); toycomp captures it (2)")
def new_object_live_at_a_graph_break(x):
    p = Point(x.sin(), x.cos())
    print("moves so far:", p.moves)
    p.move(2.0)
    return p.norm(), p.moves


@case(lambda: [(t(3, seed=i) * (1 if i != 1 else -10),) for i in range(3)])
def jump_inside_enable_grad_already_on(x):
    with torch.enable_grad():  # grad mode does not change: no node, as Dynamo coalesces them
        y = x * 2
        if y.sum() > 0:
            y = y * 3
        print("in enable_grad")
    return y


@case(lambda: [(t(3, seed=i, grad=True), i < 2) for i in range(3)],
      state=torch.is_grad_enabled, reset=lambda: torch.set_grad_enabled(True))
def set_grad_enabled_as_a_call_outlives_the_frame(x, off):
    torch.set_grad_enabled(not off)
    y = x * 2
    return y, y.requires_grad


# ----- generators run lazily: side effects only for the items taken --------------------------

TAKEN: list = []


def _log_and_yield(x):
    TAKEN.append("start")
    yield x * 2
    TAKEN.append("middle")
    yield x + 1
    TAKEN.append("end")


@case(three(3), state=lambda: list(TAKEN), reset=TAKEN.clear)
def generator_taken_one_item_at_a_time(x):
    g = _log_and_yield(x)
    first = next(g)
    TAKEN.append("between")
    return first + sum(v for v in g)


@case(three(3), state=lambda: list(TAKEN), reset=TAKEN.clear)
def any_and_all_stop_early(x):
    some = any(TAKEN.append(i) or i > 0 for i in range(4))
    every = all(TAKEN.append(-i) or i < 1 for i in range(4))
    shapes = all(d > 0 for d in x.shape)
    return x * some + every + shapes


@case(three(3), state=lambda: list(TAKEN), reset=TAKEN.clear)
def zip_and_map_take_items_lazily(x):
    out = x
    for i, v in zip(range(2), (TAKEN.append(k) or x * k for k in range(5))):
        out = out + v * i
    squares = map(lambda v: TAKEN.append(v) or x * v, [1, 2])
    TAKEN.append("map made")
    return out, list(squares)


@case(lambda: [(t(2, 5, 8, seed=i, grad=True),) for i in range(3)], grad=True)
def multihead_attention_module(x):
    # MultiheadAttention.forward reads x.is_nested and tests all(... for ... in tensor_args)
    return ATTENTION(x, x, x, need_weights=False)[0]


torch.manual_seed(0)
ATTENTION = nn.MultiheadAttention(8, 2, batch_first=True)


@case(lambda: [(t(2, 5, 8, seed=i),) for i in range(3)])
def multihead_attention_inference_takes_the_composite_path(x):
    # without grad, MultiheadAttention asks _is_make_fx_tracing() before its fused kernel
    with torch.no_grad():
        return ATTENTION_EVAL(x, x, x, need_weights=False)[0]


ATTENTION_EVAL = copy.deepcopy(ATTENTION).eval()

from tests.capture import corpus_python  # noqa: E402,F401  (more cases, registered on import)
