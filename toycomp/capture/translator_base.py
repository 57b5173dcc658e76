"""InstructionTranslatorBase: one code object's bytecode, run on variable trackers.

What every frame's interpreter shares, the root frame's and each inlined call's: the value stack
(``push``, ``pop``, ``popn``), the dispatch of each instruction to its handler in ``HANDLERS``
(instructions.py, instructions_containers.py, instructions_flow.py), the frame's globals and
closure cells, and inlining: a call to a Python function runs a child translator on the
callee's code, at most ``MAX_INLINE_DEPTH`` calls deep. What only the root frame does (take its
arguments from the real call, break the graph) is ``InstructionTranslator``, in
symbolic_convert.py, which subclasses this one and re-exports it.

Input -> output: a code object and a variable tracker per argument -> the tracker of the value
it returns (``returned``); the tensor operations it ran are nodes of the ``OutputGraph``. Here
``double`` is inlined into ``g``, so the graph holds both operations::

    >>> import torch
    >>> from toycomp.capture.output_graph import OutputGraph
    >>> from toycomp.capture.sources import LocalSource
    >>> def double(x):
    ...     return x * 2
    >>> def g(x):
    ...     return double(x) + 1
    >>> out = OutputGraph(g, g.__globals__)
    >>> x = out.wrap(torch.ones(3), LocalSource("x"))
    >>> tx = InstructionTranslatorBase(g.__code__, g.__globals__, {"x": x}, [], out, None)
    >>> tx.run()
    >>> tx.returned, out.count_calls()
    (TensorVariable(add, (3,)), 2)

NB: in PyTorch this lives in torch/_dynamo/symbolic_convert.py (InstructionTranslatorBase, and
InliningInstructionTranslator for the inlined calls).
"""

from __future__ import annotations

import builtins
import dis
import functools
import inspect

from toycomp.capture import instructions_containers, instructions_flow  # noqa: F401 (HANDLERS)
from toycomp.capture.instructions import HANDLERS, unsupported_opcode
from toycomp.capture.sources import (
    AttrSource,
    BuiltinSource,
    GetItemSource,
    GlobalSource,
    cell_source,
)
from toycomp.capture.variables.base import (
    CellVariable,
    Unsupported,
    VariableTracker,
)
from toycomp.capture.variables.lists import LazyIterator
from toycomp.capture.variables.objects import SuperVariable

MAX_INLINE_DEPTH = 32


@functools.lru_cache(maxsize=4096)
def decode(code) -> tuple[list, dict[int, int]]:
    """A code object's instructions (no ``EXTENDED_ARG``) and offset -> index, decoded once."""
    every = list(dis.get_instructions(code))
    instructions = [i for i in every if i.opname != "EXTENDED_ARG"]
    index_of = {inst.offset: i for i, inst in enumerate(instructions)}  # offset -> index
    if len(instructions) < len(every):  # EXTENDED_ARG prefixes: jump targets too
        extended_jump_targets(every, index_of)
    return instructions, index_of


def extended_jump_targets(every: list, index_of: dict[int, int]) -> None:
    """A jump whose target needs an ``EXTENDED_ARG`` prefix lands on the prefix: it maps to
    the instruction it extends."""
    pending = []
    for inst in every:
        if inst.opname == "EXTENDED_ARG":
            pending.append(inst.offset)
            continue
        for offset in pending:
            index_of[offset] = index_of[inst.offset]
        pending = []


class InstructionTranslatorBase:
    """Interprets one code object; ``HANDLERS`` (toycomp/capture/instructions.py) do the work."""

    def __init__(self, code, f_globals, symbolic_locals, closure, output, fn_source, parent=None):
        if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR) or (
                parent is None and code.co_flags & inspect.CO_GENERATOR):
            raise Unsupported(f"{code.co_name} is a generator or coroutine")
        self.code = code
        self.f_globals = f_globals
        self.symbolic_locals = dict(symbolic_locals)
        self.output = output
        self.fn_source = fn_source
        self.depth = 0 if parent is None else parent.depth + 1
        self.instructions, self.index_of = decode(code)
        self.stack: list[VariableTracker] = []
        self.ip = 0
        self.kw_names = None
        self.blocks: list[str] = []  # 3.10 block stack: "with" / "try" (SETUP_WITH, SETUP_FINALLY)
        self.returned: VariableTracker | None = None
        self.cells = self.make_cells(closure) if code.co_cellvars or code.co_freevars else {}

    def make_cells(self, closure) -> dict[str, CellVariable]:
        cells = {}
        for name in self.code.co_cellvars:  # locals captured by inner functions
            cells[name] = CellVariable(self.symbolic_locals.pop(name, None))
        for i, (name, cell) in enumerate(zip(self.code.co_freevars, closure)):
            if isinstance(cell, CellVariable):
                cells[name] = cell
            else:  # a real cell of a function defined outside: read lazily, with a source
                var = CellVariable()
                var.real = cell
                var.source = self.fn_source and cell_source(self.fn_source, i)
                cells[name] = var
        return cells

    # ----- the stack ------------------------------------------------------------------------

    def push(self, var: VariableTracker) -> None:
        self.stack.append(var)

    def pop(self) -> VariableTracker:
        return self.stack.pop()

    def popn(self, n: int) -> list[VariableTracker]:
        items = self.stack[len(self.stack) - n:]  # (not [-n:]: for 0, the whole stack)
        del self.stack[len(self.stack) - n:]
        return items

    def jump(self, inst) -> None:
        self.ip = self.index_of[inst.argval]

    # ----- running --------------------------------------------------------------------------

    def step(self) -> None:
        inst = self.instructions[self.ip]
        self.ip += 1
        self.output.location = (self.code.co_filename, self.lineno(inst), self.code.co_name)
        HANDLERS.get(inst.opname, unsupported_opcode)(self, inst)  # (instructions.py)

    def lineno(self, inst) -> int:
        """The source line of ``inst`` (3.11+: its positions; 3.10: the last line start)."""
        lineno = getattr(getattr(inst, "positions", None), "lineno", None)
        return lineno or self.last_line_start(inst)

    def last_line_start(self, inst) -> int:
        for earlier in reversed(self.instructions[: self.index_of[inst.offset] + 1]):
            if isinstance(earlier.starts_line, int) and not isinstance(earlier.starts_line, bool):
                return earlier.starts_line
        return self.code.co_firstlineno

    def run(self) -> None:
        while self.returned is None:
            self.step()

    def resume(self) -> VariableTracker | None:
        """A generator's frame: run to its next ``yield`` and give the value; None once it has
        returned (see [Note: generators run lazily] in variables/lists.py)."""
        self.yielded = None
        while self.returned is None and self.yielded is None:
            self.step()
        return self.yielded

    def do_return(self, value: VariableTracker) -> None:
        self.returned = value

    # ----- globals, cells, inlining -----------------------------------------------------------

    def global_source(self, name):
        if self.f_globals is self.output.root_globals:
            return GlobalSource(name)
        return self.fn_source and GetItemSource(AttrSource(self.fn_source, "__globals__"), name)

    def load_global(self, name: str) -> VariableTracker:
        key = (id(self.f_globals), name)
        if key in self.output.global_overrides:  # stored while tracing (STORE_GLOBAL)
            return self.output.global_overrides[key]
        if name not in self.f_globals:  # len, range...
            return self.load_builtin(name)
        return self.output.wrap(self.f_globals[name], self.global_source(name))

    def load_builtin(self, name: str) -> VariableTracker:
        if not hasattr(builtins, name):
            raise Unsupported(f"global name {name!r} is not defined")
        return self.output.wrap(getattr(builtins, name), BuiltinSource(name), guard=False)

    def store_global(self, name: str, value: VariableTracker) -> None:
        if self.f_globals is self.output.root_globals:
            where = None
        elif self.fn_source is not None:
            where = AttrSource(self.fn_source, "__globals__")
        else:
            raise Unsupported(f"global store to {name!r} from a function without a source")
        self.output.side_effects.record_store_global(where, name, value)
        self.output.global_overrides[(id(self.f_globals), name)] = value

    def load_deref(self, name: str) -> VariableTracker:
        cell = self.cells[name]
        if cell.contents is None and getattr(cell, "real", None) is not None:
            try:
                value = cell.real.cell_contents
            except ValueError:
                raise Unsupported(f"closure variable {name!r} is empty") from None
            cell.contents = self.output.wrap(value, cell.source)
        if cell.contents is None:
            raise Unsupported(f"closure variable {name!r} read before assignment")
        return cell.contents

    def store_deref(self, name: str, value: VariableTracker) -> None:
        cell = self.cells[name]
        if getattr(cell, "real", None) is not None:
            raise Unsupported(f"nonlocal store to {name!r}, a cell of a function defined outside")
        cell.contents = value

    def inline_call(self, code, f_globals, bound, closure, fn_source, name) -> VariableTracker:
        if self.depth >= MAX_INLINE_DEPTH:
            raise Unsupported(f"inlining deeper than {MAX_INLINE_DEPTH} calls ({name})")
        child = InstructionTranslatorBase(code, f_globals, bound, closure, self.output,
                                          fn_source, parent=self)
        if code.co_flags & inspect.CO_GENERATOR:  # nothing runs until an item is taken
            return LazyIterator(child.resume, f"the generator {name}")
        child.run()
        return child.returned

    def make_super(self, *args) -> SuperVariable:
        if args:
            return SuperVariable(args[0].as_python_constant(), args[1])
        cls = self.load_deref("__class__").as_python_constant()
        first = self.code.co_varnames[0]
        obj = self.symbolic_locals.get(first) or self.cells[first].contents
        return SuperVariable(cls, obj)
