"""itertools and functools while tracing: rules added to builtin.py's ``RULES``.

``itertools.product / chain / combinations / permutations / zip_longest / accumulate`` over
sequences the trace knows are made up front (their items are trackers); ``islice`` and
``count`` take items lazily, as Python does. ``functools.reduce`` calls the function on each
item in turn (inlined); ``functools.partial`` is a ``PartialVariable`` that adds its arguments
to each call; ``functools.lru_cache``-wrapped functions are traced through ``__wrapped__``
(builder.py), as Dynamo does: the cache does not change what a pure function returns.

>>> from toycomp.capture.variables.base import ConstantVariable as C
>>> from toycomp.capture.variables.lists import ListVariable
>>> it = RULES[itertools.product](None, ListVariable([C(1), C(2)]), ListVariable([C(3)]))
>>> [t.as_python_constant() for t in it.unpack_var_sequence(None)]
[(1, 3), (2, 3)]

NB: in PyTorch this lives in torch/_dynamo/variables/iter.py (ItertoolsVariable) and
torch/_dynamo/variables/functions.py (FunctoolsPartialVariable).
"""

from __future__ import annotations

import functools
import itertools
import operator

from toycomp.capture.variables.base import ConstantVariable, Unsupported, VariableTracker
from toycomp.capture.variables.builtin import RULES, BuiltinVariable
from toycomp.capture.variables.lists import (
    DictVariable,
    LazyIterator,
    ListIteratorVariable,
    TupleVariable,
    as_iterator,
)


def _combinatoric(fn):
    """product, combinations, permutations...: on the items (trackers) of finite iterables;
    the integer arguments (``r``, ``repeat``) must be constants."""
    def rule(tx, *seqs, **kwargs):
        consts = {k: v.as_python_constant() for k, v in kwargs.items()}
        if fn in (itertools.combinations, itertools.permutations,
                  itertools.combinations_with_replacement):
            items = seqs[0].unpack_var_sequence(tx)
            rows = fn(items, *[s.as_python_constant() for s in seqs[1:]], **consts)
        else:
            rows = fn(*[s.unpack_var_sequence(tx) for s in seqs], **consts)
        return ListIteratorVariable([TupleVariable(list(row)) for row in rows])
    return rule


def _lazy_or_list(tx, produce, what, iterators) -> ListIteratorVariable:
    """Lazy over a lazy iterator (a generator), else made now (a list can be rebuilt after
    the graph; a half-run generator cannot)."""
    iterator = LazyIterator(produce, what)
    if any(isinstance(it, LazyIterator) for it in iterators):
        return iterator
    return ListIteratorVariable(iterator.unpack_var_sequence(tx))


def _chain(tx, *seqs):
    iterators = [as_iterator(tx, s) for s in seqs]
    pending = list(iterators)

    def produce():
        while pending:
            item = pending[0].next_item()
            if item is not None:
                return item
            pending.pop(0)
        return None
    return _lazy_or_list(tx, produce, "itertools.chain", iterators)


def _chain_from_iterable(tx, seqs):
    return _chain(tx, *seqs.unpack_var_sequence(tx))


def _islice(tx, seq, *bounds):
    """Takes items of ``seq`` only as they are asked for (``seq`` may be a generator)."""
    start, stop, step = slice(*[b.as_python_constant() for b in bounds]).indices(2**62)
    iterator = as_iterator(tx, seq)
    positions = iter(range(start, stop, step))
    taken = [0]  # items taken from ``iterator`` so far

    def produce():
        want = next(positions, None)
        while want is not None:
            item = iterator.next_item()
            taken[0] += 1
            if item is None:
                return None
            if taken[0] - 1 == want:
                return item
        return None
    return _lazy_or_list(tx, produce, "itertools.islice", [iterator])


def _count(tx, start=ConstantVariable(0), step=ConstantVariable(1)):
    counter = itertools.count(start.as_python_constant(), step.as_python_constant())
    return LazyIterator(lambda: ConstantVariable(next(counter)), "itertools.count")


def _repeat(tx, value, times=None):
    if times is None:
        return LazyIterator(lambda: value, "itertools.repeat")
    return ListIteratorVariable([value] * times.as_python_constant())


def _accumulate(tx, seq, func=None, *, initial=None):
    add = func or BuiltinVariable(operator.add)
    items = seq.unpack_var_sequence(tx)
    out = [] if initial is None else [initial]
    for item in items:
        out.append(item if not out else add.call_function(tx, [out[-1], item], {}))
    return ListIteratorVariable(out)


def _reduce(tx, fn, seq, *initial):
    items = list(initial) + as_iterator(tx, seq).unpack_var_sequence(tx)
    if not items:
        raise Unsupported("functools.reduce() of an empty sequence with no initial value")
    total = items[0]
    for item in items[1:]:
        total = fn.call_function(tx, [total, item], {})
    return total


class PartialVariable(VariableTracker):
    """``functools.partial(fn, *args, **kwargs)``: each call adds its own arguments to these."""

    def __init__(self, fn: VariableTracker, args: list, kwargs: dict, source=None):
        self.fn, self.args, self.kwargs, self.source = fn, list(args), dict(kwargs), source

    def python_type(self):
        return functools.partial

    def call_function(self, tx, args, kwargs):
        return self.fn.call_function(tx, self.args + list(args), {**self.kwargs, **kwargs})

    def var_getattr(self, tx, name):
        if name == "func":
            return self.fn
        if name == "args":
            return TupleVariable(self.args)
        if name == "keywords":
            return DictVariable(self.kwargs)
        return super().var_getattr(tx, name)

    def reconstruct(self, codegen):
        if self.source is not None:
            return codegen.source(self.source)
        parts = [codegen.reconstruct(self.fn), *map(codegen.reconstruct, self.args)]
        parts += [f"{k}={codegen.reconstruct(v)}" for k, v in self.kwargs.items()]
        partial = codegen.constant(functools.partial)
        return codegen.new_object(self, f"{partial}({', '.join(parts)})")

    def __repr__(self):
        return f"PartialVariable({self.fn})"


def _partial(tx, fn, *args, **kwargs):
    if isinstance(fn, PartialVariable):  # partial(partial(f, a), b) is partial(f, a, b)
        return PartialVariable(fn.fn, fn.args + list(args), {**fn.kwargs, **kwargs})
    return PartialVariable(fn, args, kwargs)


RULES.update({
    itertools.product: _combinatoric(itertools.product),
    itertools.combinations: _combinatoric(itertools.combinations),
    itertools.combinations_with_replacement: _combinatoric(itertools.combinations_with_replacement),
    itertools.permutations: _combinatoric(itertools.permutations),
    itertools.zip_longest: _combinatoric(itertools.zip_longest),
    itertools.chain: _chain, itertools.chain.from_iterable: _chain_from_iterable,
    itertools.islice: _islice, itertools.count: _count, itertools.repeat: _repeat,
    itertools.accumulate: _accumulate, functools.reduce: _reduce, functools.partial: _partial,
})
