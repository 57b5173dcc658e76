"""The capture corpus, continued: Python's own semantics as Dynamo keeps them (dict views,
OrderedDict and NamedTuple across a graph break, sets, itertools, functools, NumPy, random...).
Registered into ``tests.capture.corpus.CASES`` (see that module for ``Case``)."""

from __future__ import annotations

import collections
import collections.abc
import functools
import itertools
import random
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn as nn

from tests.capture.corpus import KW, Case, case, t, three  # noqa: F401

# ----- dict views are live ---------------------------------------------------------------------


@case(three(3), whole_frame=True)
def dict_views_see_later_inserts(x):
    d = {"a": x}
    keys, values, items = d.keys(), d.values(), d.items()
    d["b"] = x * 2
    d.update(c=x + 1)
    d.pop("a")
    return (len(keys), list(keys), sum(values), [k for k, _ in items], "c" in keys,
            sorted(keys - {"b"}), dict(items), isinstance(keys, collections.abc.KeysView))


@case(three(3))
def dict_views_across_a_break(x):
    d = {"a": x}
    keys, values = d.keys(), d.values()
    print("break")
    d["b"] = x * 2
    del d["a"]
    return list(keys), list(values), len(values)


# ----- OrderedDict, NamedTuple, namedtuple across a break --------------------------------------


@case(three(3), whole_frame=True)
def ordered_dict_built(x):
    d = collections.OrderedDict()
    d["b"] = x
    d["a"] = x * 2
    e = collections.OrderedDict(d)
    e.move_to_end("b")
    return type(e).__name__, list(e), e["a"] + e["b"], isinstance(e, dict)


@case(three(3), dynamo_differs="Dynamo 2.13 does not trace the resume function when an object "
      "made in the frame is live across the break (1 graph); toycomp captures it (2)")
def ordered_dict_across_a_break(x):
    d = {"a": x, "b": x + 1}
    e = collections.OrderedDict(d)
    print("break")
    return type(e).__name__, isinstance(e, collections.OrderedDict), list(e), e["a"] * e["b"]


class Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


@case(three(3))
def named_tuple_across_a_break(x):
    p = Pair(x, x * 2)
    print("break")
    return (isinstance(p, tuple), type(p).__name__, p._fields, list(p._asdict()),
            p.first + p[1], len(p))


Coords = collections.namedtuple("Coords", ["u", "v"])


@case(three(3), whole_frame=True)
def namedtuple_attribute_access(x):
    c = Coords(x, x + 1)
    u, v = c
    k = Coords(2, 3)
    return c.u * c.v + u - v, c._fields, c._replace(u=x * 3).u, k, k._asdict(), k == (2, 3)


# ----- gradients and requires_grad --------------------------------------------------------------


def _two_grad_inputs():
    return [(t(3, seed=i, grad=True), t(3, seed=i + 5, grad=True)) for i in range(3)]


@case(_two_grad_inputs, grad=True, whole_frame=True)
def unused_input_keeps_grad_none(x, unused):
    return x * 2


@case(_two_grad_inputs, grad=True)
def input_used_only_without_grad_keeps_grad_none(x, y):
    with torch.no_grad():
        k = y.sum()
    return x * k


class Holder:
    pass


HOLDER = Holder()


@case(three(3, grad=True), grad=True,
      state=lambda: (HOLDER.last.requires_grad, HOLDER.last.grad_fn is None,
                     HOLDER.plain.requires_grad, HOLDER.last.detach().clone()), whole_frame=True)
def tensor_stored_on_an_object(x):
    y = x * 2
    HOLDER.last = y
    HOLDER.plain = y.detach() + 1
    return y.sin()


@case(three(3, grad=True), grad=True, whole_frame=True)
def grad_mode_blocks_requires_grad(x):
    with torch.no_grad():
        a = x * 2
    with torch.enable_grad():
        b = x * 3
    with torch.set_grad_enabled(False):
        c = x + 1
    return a, b, c, a.requires_grad, b.requires_grad, c.requires_grad


@case(three(3))
def ordered_dict_isinstance_after_a_break(x):
    e = collections.OrderedDict({"a": x})
    print("break")
    e["b"] = x + 1
    return isinstance(e, collections.OrderedDict), e["a"] * e["b"]


@case(three(3))
def named_tuple_isinstance_after_a_break(x):
    p = Pair(x, x * 2)
    print("break")
    return isinstance(p, tuple), isinstance(p, Pair), p.first + p.second


# ----- needless errors -----------------------------------------------------------------------


class Scale:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return x * self.k


@case(three(3))
def bound_method_of_new_object_across_a_break(x):
    s = Scale(3.0)
    f = s.apply
    print("break")
    return f(x)


@case(three(3), whole_frame=True)
def augmented_assignment_to_a_literal(x):
    x0 = 1
    x0 += x
    x1 = 2.0
    x1 *= x
    return x0 + x1


@case(three(3), whole_frame=True)
def jit_annotate(x):
    y = torch.jit.annotate(Any, x + 1)
    z = torch.jit.annotate(list[torch.Tensor], [y, x])
    return y * 2 + z[1]


@case(three(3, grad=True), grad=True, whole_frame=True)
def no_grad_block_reads_a_local(x):
    scale = 2.0
    y = x * 3
    with torch.no_grad():
        z = y * scale
        w = z + scale
    return y * w


@case(three(3), whole_frame=True)
def from_numpy_round_trip(x):
    y = x * 2
    z = torch.from_numpy(y.numpy())
    return z + 1


@case(three(3))
def add_with_out_and_no_tensor_operand(x):
    out = torch.empty(())
    torch.add(2, 3, out=out)
    return x * out


@case(lambda: [(t(2, 3),), (t(3, 4, seed=1),), (t(4, 5, seed=2),)],  # sizes become symbols
      whole_frame=True)
def arange_of_product_of_sizes(x):
    n, m = x.shape
    r = torch.arange(n * m)
    s = torch.arange(1, n, 1)
    return r, r.dtype, x.reshape(-1) + r, s, torch.arange(float(m)).dtype


@case(three(3))
def resume_reads_stack_before_rebuilding(x):
    a = x * 2
    z = (a.sin(), print("break"))[0]  # z is the resume function's __stack0
    w = (a.cos(), print("again"))[0]  # the second break rebuilds its own stack
    b = a + len([print("once"), print("twice"), a.sum()]) + a
    return z, w, b


def _grad_mode_per_call(i):
    torch.set_grad_enabled(i != 1)


@case(three(3, grad=True), grad=True, before=_grad_mode_per_call,
      state=torch.is_grad_enabled, reset=lambda: torch.set_grad_enabled(True))
def enable_grad_inside_a_call_under_no_grad(x):
    with torch.no_grad():
        a = x * 2
    with torch.enable_grad():
        b = x * 3 + a
    c = x.sin()
    return a, b, c, b.requires_grad, c.requires_grad


@case(three(3))
def numpy_array_of_a_tensor_returned_and_across_a_break(x):
    y = x * 2
    a = y.numpy()
    print("break")
    z = torch.from_numpy(a) + 1
    return a.shape, z, y.numpy()


@case(three(3))
def numpy_method_on_a_tensors_data_breaks_naming_it(x):
    y = x * 2
    s = y.numpy().sum()
    return y + float(s)


# ----- whole frames that Dynamo compiles as one graph -------------------------------------------


@case(three(3), whole_frame=True)
def set_literals_and_methods(x):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    u = s | {7}
    both = s & {2, 4, 9}
    return x * len(u) + sum(sorted(both)), 3 in s, sorted(s - {2}), len(set([1, 1, 2]))


@case(three(3), whole_frame=True)
def itertools_chain_product_combinations_islice(x):
    total = x
    for a, b in itertools.product([1, 2], [3, 4]):
        total = total + a * b
    for k in itertools.chain([1, 2], (3,)):
        total = total * k
    total = total + sum(itertools.chain.from_iterable([[x], [x * 2, 1]]))
    pairs = list(itertools.combinations(range(4), 2))
    firsts = list(itertools.islice(itertools.count(5), 3))
    return total + len(pairs), firsts, pairs[-1]


@case(three(3), whole_frame=True)
def numpy_constants_finfo_iinfo(x):
    eps = np.finfo(np.float32).eps
    big = np.iinfo(np.int32).max
    return x.clamp(min=float(eps)) + (big % 7), float(np.pi)


@case(lambda: [(t(3, seed=i), t(3, seed=i + 5)) for i in range(3)], whole_frame=True)
def max_min_of_tensors(x, y):
    return max(x, y) if False else torch.maximum(x, y), max([x.sum(), y.sum()])


@case(three(3), whole_frame=True)
def reversed_list(x):
    ys = [x, x * 2, x * 3]
    out = []
    for y in reversed(ys):
        out.append(y + len(out))
    return out, list(reversed([1, 2, 3]))


@case(three(3))
def lambda_alive_across_a_break(x):
    k = 2.0
    f = lambda v: v * k + 1  # noqa: E731
    g = lambda v: v - 1  # noqa: E731
    print("break")
    return f(x) + g(x)


class Bag:
    def __init__(self, *items):
        self.items = list(items)

    def __iter__(self):
        return iter(self.items)

    def __radd__(self, other):
        return other + sum(self.items)


@case(three(3), whole_frame=True)
def user_object_with_iter(x):
    bag = Bag(x, x * 2)
    total = 0
    for v in bag:
        total = total + v
    return total, [v * 1 for v in bag], list(Bag(1, 2))


BAG = Bag(1.0, 2.0)


@case(three(3), whole_frame=True)
def user_object_with_radd(x):
    bag = Bag(x, x * 2)
    return (x + bag) * (3 + BAG), 1 + Bag(2, 3)


def _add(a, b):
    return a + b


@functools.lru_cache(maxsize=None)
def _cached_scale(n):
    return n * 2


LINEAR = nn.Linear(3, 3)


def _apply(module, x, scale):
    return module(x) * scale


@case(three(3), whole_frame=True)
def functools_reduce_lru_cache_partial_of_module(x):
    total = functools.reduce(_add, [x, x * 2, x * 3])
    total = functools.reduce(lambda a, b: a * b, [1, 2, 3], total)
    run = functools.partial(_apply, LINEAR, scale=2.0)
    return total * _cached_scale(3) + run(x)


@case(three(3), whole_frame=True)
def dict_update_forms(x):
    d = {"a": x}
    d.update({"b": x * 2})
    d.update([("c", x + 1)], e=x - 1)
    d.update(f=3)
    d |= {"g": x}
    return {k: v * 2 for k, v in d.items()}, len(d)


@case(three(3), dynamo_differs="Dynamo 2.13 compiles no graph for this frame (0); toycomp breaks "
      "at each random call, as Dynamo does, and compiles the arithmetic after them (1); both "
      "draw eager's random numbers")
def random_calls(x):
    a = random.random()
    b = random.randint(1, 10)
    c = random.uniform(0.5, 1.5)
    return x * a + b * c


APPLY_LINEAR = functools.partial(_apply, LINEAR, scale=3.0)


@case(three(3), grad=True, whole_frame=True)
def global_partial_holding_a_module(x):
    return APPLY_LINEAR(x) + APPLY_LINEAR(x * 2, scale=0.5)


@case(lambda: [(t(3, seed=i), collections.OrderedDict(a=t(3, seed=i + 1), b=2.0))
               for i in range(3)], whole_frame=True)
def ordered_dict_argument_mutated(x, d):
    d.move_to_end("a")
    d["c"] = x * d["b"]
    e = d.copy()
    return type(d).__name__, list(d), e, x + d["a"], isinstance(e, collections.OrderedDict)


@case(three(3), whole_frame=True)
def dict_from_pairs_and_zip(x):
    d = dict(zip(["a", "b"], [x, x * 2]))
    d.update(zip(["c"], [x + 1]))
    o = collections.OrderedDict([("z", x), ("y", x - 1)])
    o.update(d)
    return list(o), o.popitem(last=False)[0], list(reversed(o)), sum(o.values())
