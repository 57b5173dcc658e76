"""InstructionTranslator: a function's bytecode, interpreted on variable trackers -> a graph.

The translator walks ``dis.get_instructions(code)`` with a value stack and a dict of locals, as
CPython's ``ceval`` does, but every value is a variable tracker (toycomp/capture/variables/) and
every tensor operation lands in the ``OutputGraph``. Calls to Python functions are inlined by
a child translator on the callee's code. What every frame shares (the stack, the dispatch to the
opcode handlers, globals, cells, inlining) is ``InstructionTranslatorBase`` in
translator_base.py, re-exported here. This module holds the root frame's translator, which ends
in one of two ways:

* ``RETURN_VALUE``: ``self.plan`` is a ``Return`` of the value;
* a graph break at step ``break_at``: ``self.plan`` is a ``Break`` with the live stack and
  locals, which toycomp/capture/transformed_code.py turns into Python.

>>> import torch
>>> from toycomp.capture.output_graph import OutputGraph
>>> def f(x, n):
...     for i in range(n):
...         x = x * 2
...     return x
>>> out = OutputGraph(f, f.__globals__)
>>> tx = InstructionTranslator(f, {"x": torch.ones(3), "n": 2}, out)
>>> tx.run()
>>> tx.plan.value, out.count_calls()
(TensorVariable(mul_1, (3,)), 2)

[Note: graph breaks restart the trace]
An instruction may fail half-way: ``helper(x)`` can add ten nodes and record a side effect
before meeting ``print`` deep inside the helper. Rather than undoing that, the translator raises
``BreakRequest(step)`` and the caller traces the frame again from the start with ``break_at=step``,
stopping *before* that instruction with a clean state. Dynamo does the same (its
``SpeculationLog`` restarts analysis after a failed instruction).

[Note: where a frame can break]
Like Dynamo, a graph break is resumed *at* the instruction only for calls, comparisons,
subscripts, attribute / item stores and conditional jumps, and only outside ``try`` blocks (a
resume function cannot re-create an active exception handler; ``with`` blocks are re-entered,
see toycomp/capture/resume_execution.py). Anywhere else the trace falls back to its last
*checkpoint*: the last instruction it reached with an empty stack, outside any ``try`` block,
with at least two operations in the graph. The graph ends there and the rest of the frame runs
eagerly, in a resume function that is not captured (Dynamo: ``step_graph_break``, reported as
``step_unsupported``). With no checkpoint the whole frame runs eagerly (a skipped frame). A
break inside a loop also skips the frame, as Dynamo does.

NB: in PyTorch this lives in torch/_dynamo/symbolic_convert.py (InstructionTranslatorBase,
InstructionTranslator, InliningInstructionTranslator).
"""

from __future__ import annotations

import dis
import functools
import operator
from dataclasses import dataclass, field

import torch

from toycomp.capture.instructions import COMPARE_OPS
from toycomp.capture.instructions_flow import CALL_OPS, pop_call_operands
from toycomp.capture.resume_execution import discarded_argument, is_resume_function
from toycomp.capture.sources import FunctionSource, LocalSource
from toycomp.capture.translator_base import InstructionTranslatorBase, decode
from toycomp.capture.variables.base import (
    ConstantVariable,
    SkipFrame,
    Unsupported,
    VariableTracker,
)
from toycomp.capture.variables.builtin import BuiltinVariable
from toycomp.capture.variables.torch import WithExitFunctionVariable


class BreakRequest(Exception):
    """Unsupported at root step ``step``: trace again and break there (see the Note above).
    ``kind`` "step": ``step`` is the last checkpoint, where the rest of the frame runs eagerly
    (see [Note: where a frame can break])."""

    def __init__(self, step: int, reason: str, location, kind: str | None = None):
        super().__init__(reason)
        self.step, self.reason, self.location, self.kind = step, reason, location, kind

    @property
    def info(self) -> tuple:
        return self.reason, self.location, self.kind


@dataclass
class Return:
    value: VariableTracker
    reason = location = None  # (a Break's fields: a return is no graph break)


@dataclass
class Break:
    """The frame's state just before the instruction ``inst`` that could not be traced."""

    inst: dis.Instruction
    kind: str  # "call": run the call in Python; "jump": branch in Python; "step": rest eagerly
    stack: list  # below the call's operands / the jump's condition
    locals: dict
    reason: str = ""
    location: tuple = ()
    call: tuple = ()  # (fn, args, kwargs) for "call"
    pushes: bool = True  # does the call leave a result on the stack (a store does not)
    condition: VariableTracker | None = None  # for "jump"
    resume_offsets: list = field(default_factory=list)
    cells: dict = field(default_factory=dict)  # cell variables holding a value


JUMPS = set(dis.hasjrel) | set(dis.hasjabs)
JUMPS = {dis.opname[op] for op in JUMPS}
# Instructions a graph break can resume *at* (Dynamo: ``break_graph_if_unsupported``): the
# operands are popped and the operation runs in Python as a call; ``pushes``: it leaves a result.
STACK_OPS = {  # opname -> (number of operands, (inst, operands) -> (function, args), pushes)
    "BINARY_SUBSCR": (2, lambda inst, ops: (operator.getitem, ops), True),
    "COMPARE_OP": (2, lambda inst, ops: (
        COMPARE_OPS[inst.argval.replace("bool(", "").rstrip(")")], ops), True),
    "STORE_SUBSCR": (3, lambda inst, ops: (operator.setitem, [ops[1], ops[2], ops[0]]), False),
    "STORE_ATTR": (2, lambda inst, ops: (setattr, [ops[1], ConstantVariable(inst.argval),
                                                  ops[0]]), False),
}


def is_resumable(inst) -> bool:
    """Can a graph break at ``inst`` run it in Python and resume after it?"""
    return inst.opname in STACK_OPS or inst.opname in CALL_OPS or (
        inst.opname.startswith("POP_JUMP") and inst.opname.endswith(("TRUE", "FALSE")))


class InstructionTranslator(InstructionTranslatorBase):
    """The root frame: its arguments come from the real call, and it may break the graph.

    Args:
        fn: the function (or resume function) being compiled.
        frame_locals: its bound arguments, by name (what the guards call ``L``).
        output: the OutputGraph to fill.
        break_at: stop before this step and make a ``Break`` (see [Note: graph breaks ...]).
        break_info: ``(reason, location, kind)`` of that break, from the first attempt.
    """

    def __init__(self, fn, frame_locals, output, break_at=None, break_info=None):
        # a resume function's first argument may be unread: no guard
        unread = discarded_argument(fn.__code__) if is_resume_function(fn.__code__) else None
        symbolic = {name: output.wrap(value, LocalSource(name),
                                      guard=name != unread or isinstance(value, torch.Tensor))
                    for name, value in frame_locals.items()}
        super().__init__(fn.__code__, fn.__globals__, symbolic, list(fn.__closure__ or ()),
                         output, FunctionSource())
        self.steps = 0
        self.break_at = break_at
        self.break_info = break_info or ("", (), None)  # (reason, location, kind)
        self.plan: Return | Break | None = None
        self.resumable: list[tuple] = []  # (step, inst, in a 3.10 try) at an empty stack
        self.grad_mode_at_start = torch.is_grad_enabled()

    def run(self) -> None:
        while self.plan is None and self.steps != self.break_at:
            inst, stack = self.instructions[self.ip], list(self.stack)  # (a failed step pops)
            if not stack and self.output.count_calls() > 1:  # a point the rest may resume at
                self.resumable.append((self.steps, inst, "try" in self.blocks))
            self.steps += 1
            try:
                self.step()
            except (SkipFrame, BreakRequest):
                raise
            except Exception as e:  # Unsupported, or a bug in toycomp: a break, not a crash
                raise self.break_request(inst, self.in_try(inst, stack), e) from e
        if self.plan is None:  # stopped before step ``break_at``
            self.plan = self.make_break()
        if torch.is_grad_enabled() != self.grad_mode_at_start:  # torch.set_grad_enabled(False)
            self.output.side_effects.record_grad_mode(torch.is_grad_enabled())

    def in_try(self, inst, stack: list | None = None) -> bool:
        """Is ``inst`` inside a ``try`` block (directly, or in a ``with`` on ``stack`` inside
        one)?"""
        if "try" in self.blocks or in_try_range(self.code, inst):
            return True
        return any(getattr(v, "in_try", False) for v in (self.stack if stack is None else stack))

    def last_checkpoint(self) -> int | None:
        """The last step with an empty stack outside any ``try`` block, with two operations or
        more in the graph (see [Note: where a frame can break]); None if there is none."""
        for step, inst, in_try_block in reversed(self.resumable):
            if not in_try_block and not in_try_range(self.code, inst):
                return step
        return None

    def break_request(self, inst, in_try: bool, error: Exception) -> BreakRequest:
        """Where to break for ``error`` raised at ``inst`` (see [Note: where a frame ...])."""
        if isinstance(error, Unsupported):
            reason = error.reason
        else:  # a bug in toycomp: break the graph rather than crash
            reason = f"toycomp internal error: {type(error).__name__}: {error}"
        location = self.output.location
        if is_resumable(inst) and not in_try:
            if self.has_backedge(inst):
                raise SkipFrame(f"graph break in a for/while loop (as Dynamo): {reason}")
            return BreakRequest(self.steps - 1, reason, location)
        where = "inside a try block" if in_try else f"at {inst.opname}"
        checkpoint = self.last_checkpoint()
        if checkpoint is None:
            raise SkipFrame(f"graph break {where}, with no earlier point to resume from "
                            f"(as Dynamo): {reason}")
        reason = (f"{reason} [{where}: the graph ends at the last resumable point and the rest "
                  "of the frame runs eagerly (Dynamo: step_unsupported)]")
        return BreakRequest(checkpoint, reason, location, kind="step")

    def do_return(self, value):
        self.plan = Return(value)

    def make_break(self) -> Break:
        """The state before instruction ``ip``, split into what runs in Python and the rest.
        The ``with`` blocks open there are exited at the end of the graph (the transformed
        function re-enters them around the breaking instruction, the resume function for the
        rest of the block)."""
        inst = self.instructions[self.ip]
        reason, location, kind = self.break_info
        last = self.ip + 1 >= len(self.instructions)
        nxt = None if last else self.instructions[self.ip + 1].offset
        if kind == "step":
            assert not self.stack, "a checkpoint has an empty stack"
            plan = Break(inst, "step", [], dict(self.symbolic_locals), reason, location,
                         resume_offsets=[inst.offset])
        else:
            plan = self.break_plan(inst, nxt, reason, location)
        plan.cells = self.live_cells()
        for var in reversed(plan.stack):
            if isinstance(var, WithExitFunctionVariable):
                var.ctx.exit(self)
        return plan

    def has_backedge(self, inst) -> bool:
        """Is ``inst`` inside a loop: does a later jump, before the next return, go back before
        it? (Dynamo's ``maybe_has_backedge`` heuristic.)"""
        for later in self.instructions[self.index_of[inst.offset]:]:
            if later.opname in ("RETURN_VALUE", "RETURN_CONST"):
                return False
            if later.opname in JUMPS and later.argval < inst.offset:
                return True
        return False

    def break_plan(self, inst, nxt, reason, location) -> Break:
        if inst.opname in STACK_OPS:
            pops, operation, pushes = STACK_OPS[inst.opname]
            fn, args = operation(inst, self.popn(pops))
            return Break(inst, "call", list(self.stack), dict(self.symbolic_locals), reason,
                         location, call=(BuiltinVariable(fn), args, {}), resume_offsets=[nxt],
                         pushes=pushes)
        if inst.opname in CALL_OPS:
            call = pop_call_operands(self, inst)
            return Break(inst, "call", list(self.stack), dict(self.symbolic_locals), reason,
                         location, call=call, resume_offsets=[nxt])
        condition = self.pop()  # a conditional jump (is_resumable)
        targets = [nxt, inst.argval] if inst.opname.endswith("FALSE") else [inst.argval, nxt]
        return Break(inst, "jump", list(self.stack), dict(self.symbolic_locals), reason,
                     location, condition=condition, resume_offsets=targets)

    def live_cells(self) -> dict:
        """Cell variables of this frame that hold a value (passed on to a resume function)."""
        return {name: cell.contents for name, cell in self.cells.items()
                if name in self.code.co_cellvars and cell.contents is not None}


def in_try_range(code, inst) -> bool:
    return any(lo <= inst.offset < hi for lo, hi in try_block_ranges(code))


@functools.lru_cache(maxsize=4096)
def try_block_ranges(code) -> list[tuple[int, int]]:
    """[start, end) offsets covered by an exception handler that is not a ``with`` block's
    cleanup (3.11+'s exception table; 3.10 tracks ``SETUP_FINALLY`` blocks as it runs)."""
    entries = getattr(dis.Bytecode(code), "exception_entries", None) or []
    insts, at = decode(code)
    ranges = []
    for e in entries:
        handler = insts[at[e.target]: at[e.target] + 2]
        if not any(i.opname == "WITH_EXCEPT_START" for i in handler):
            ranges.append((e.start, e.end))
    return ranges
