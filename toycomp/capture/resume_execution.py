"""Resume functions: a code object that continues ``fn`` from one instruction.

After a graph break, the rest of ``fn`` (from the instruction after the break) must run and be
captured in turn. A resume function is a copy of ``fn``'s bytecode with a short prefix: its
arguments are the values that were on the stack and in the locals at the break; the prefix
pushes the stack values back and jumps to the instruction where ``fn`` left off::

    def f(x):                          __resume_at_30(__stack0, x):   # bytecode, as Python:
        y = x.sin()                        <push __stack0>
        print(y)        <- break           jump to offset 30 (after print's CALL)
        return y.cos()                     ... f's own bytecode from there: POP_TOP, return y.cos()

A break inside ``with torch.no_grad():`` leaves the block's ``__exit__`` on the stack. It is not
passed on: the prefix enters the block again, ``with __stack0(False):`` (``__stack0`` is
``torch.set_grad_enabled``; a ``ReenterWith`` in the stack layout), which leaves a new
``__exit__`` in the same stack slot, so ``fn``'s own bytecode leaves the block where it always
did, exceptions included (the exception table still covers the rest of the block).

Its bytecode is made with the ``bytecode`` package, which keeps labels, exception tables and
line numbers right when instructions are inserted. Resume functions are cached by (code,
offset, stack layout, argument names), so a recompile reuses them.

>>> stack_arg_names([False, True, False])  # the stack at the break held a NULL in the middle
['__stack0', '__stack2']

NB: in PyTorch this lives in torch/_dynamo/resume_execution.py (ContinueExecutionCache,
``generate`` / ``ResumeFunctionMetadata``, ``ReenterWith``).
"""

from __future__ import annotations

import dis
import inspect
import sys
import types

from dataclasses import dataclass

from bytecode import Bytecode, Instr, Label, TryBegin

_CACHE: dict[tuple, types.CodeType] = {}
_ORIGIN: dict[types.CodeType, tuple[types.CodeType, int]] = {}  # resume code -> (original, prefix)
_FUNCTIONS: dict[tuple, types.FunctionType] = {}  # (cells keyed by id; the function keeps them)


@dataclass(frozen=True)
class ReenterWith:
    """A stack slot that held a ``with`` block's ``__exit__``: the prefix calls the slot's
    argument (a context manager class) with ``args`` and enters it (Dynamo: ``ReenterWith``)."""

    args: tuple


def stack_arg_names(nulls: list) -> list[str]:
    """The resume function's parameters for the stack values (NULLs are pushed, not passed)."""
    return [f"__stack{i}" for i, kind in enumerate(nulls) if kind is not True]


def make_resume_code(code: types.CodeType, offset: int, nulls: list,
                     local_names: list[str]) -> types.CodeType:
    """``code`` continued at instruction ``offset`` with the stack ``nulls`` describes.

    Args:
        code: the original function's code object.
        offset: the ``dis`` offset of the instruction to continue at.
        nulls: one entry per stack value, bottom first: True where the value is a NULL, a
            ``ReenterWith`` where it was a ``with`` block's ``__exit__``, else False.
        local_names: the locals (and cells) passed as arguments after the stack values.

    Returns:
        A code object whose positional parameters are ``__stack<i>...`` then ``local_names``.
    """
    code, offset = original_position(code, offset)
    key = (code, offset, tuple(nulls), tuple(local_names))
    if key not in _CACHE:
        _CACHE[key], prefix = _generate(code, offset, nulls, local_names)
        _ORIGIN[_CACHE[key]] = (code, prefix)
    return _CACHE[key]


def original_position(code, offset) -> tuple[types.CodeType, int]:
    """A break inside a resume function resumes the *original* code, so a loop that breaks on
    every iteration reuses one resume function instead of nesting new ones."""
    if code not in _ORIGIN:
        return code, offset
    original, prefix = _ORIGIN[code]
    insts = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    here = [i.offset for i in insts]
    there = [i.offset for i in dis.get_instructions(original) if i.opname != "EXTENDED_ARG"]
    names = [i.opname for i in insts]
    start = names.index("RESUME") + 1 if "RESUME" in names else 0  # the prefix follows RESUME
    index = here.index(offset)
    if index < start + prefix and index >= start:
        raise ValueError("a break inside a resume function's prefix")
    return original, there[index - prefix if index >= start + prefix else index]


def _generate(code, offset, nulls, local_names) -> tuple[types.CodeType, int]:
    """The resume code, and the number of instructions in its prefix."""
    bc = Bytecode.from_code(code)
    instrs = list(bc)
    real = [i for i in instrs if isinstance(i, Instr)]
    originals = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    target = real[[i.offset for i in originals].index(offset)]
    label = Label()
    instrs.insert(next(k for k, i in enumerate(instrs) if i is target), label)
    handlers = iter(with_handlers_310(real, originals, offset))
    prefix = []
    for i, kind in enumerate(nulls):
        if kind is True:
            prefix.append(push_null())
        elif kind is False:
            prefix.append(Instr("LOAD_FAST", f"__stack{i}"))
        else:
            prefix += reenter_with(f"__stack{i}", kind.args, next(handlers, None))
    prefix.append(Instr("JUMP_FORWARD", label))
    start = 0
    if sys.version_info >= (3, 11):  # after MAKE_CELL / COPY_FREE_VARS / RESUME
        start = 1 + next(k for k, i in enumerate(instrs)
                         if isinstance(i, Instr) and i.name == "RESUME")
    bc.clear()
    bc.extend(instrs[:start] + prefix + instrs[start:])
    bc.argnames = stack_arg_names(nulls) + list(local_names)
    bc.argcount = len(bc.argnames)
    bc.posonlyargcount = bc.kwonlyargcount = 0
    bc.flags &= ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    bc.name = f"__resume_at_{offset}"
    if hasattr(bc, "qualname"):
        bc.qualname = f"{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name}" \
                      f".__resume_at_{offset}"
    # The prefix jumps into the middle of try regions, which the ``bytecode`` package's stack
    # analysis does not follow: the stack depths of the exception table are the original's
    # (the prefix rebuilds the same stack), and the stack size is bounded by hand.
    keep_exception_depths(code, instrs, dict(zip(map(id, real), originals)))
    stacksize = code.co_stacksize + len(prefix) + 4
    return bc.to_code(stacksize=stacksize, compute_exception_stack_depths=False), len(prefix)


def is_resume_function(code: types.CodeType) -> bool:
    return code in _ORIGIN


def discarded_argument(code: types.CodeType) -> str | None:
    """The stack argument that a resume function pops unread as its first instruction (the
    result of a call whose value the user discards: ``y.sum().item()`` on its own line), or
    None. Its value needs no guard: a guard on it would recompile for every new value."""
    insts = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    names = [i.opname for i in insts]
    start = names.index("RESUME") + 1 if "RESUME" in names else 0
    prefix = insts[start: start + _ORIGIN[code][1]]
    if len(prefix) < 2 or prefix[-1].opname != "JUMP_FORWARD" or prefix[-2].opname != "LOAD_FAST":
        return None
    target = next(i for i in insts if i.offset == prefix[-1].argval)
    return prefix[-2].argval if target.opname == "POP_TOP" else None


def call_through(fn, *args, **kwargs):
    """3.10's stand-in for a NULL below a callable (see ``push_null``)."""
    return fn(*args, **kwargs)


def push_null() -> Instr:
    """The NULL that 3.10's LOAD_METHOD pushes below a plain callable ([NULL, fn, args...]).
    3.11+ has PUSH_NULL; 3.10 cannot push a NULL, so it pushes ``call_through`` instead, which
    CALL_METHOD then calls as the "method" with ``fn`` as its "self": ``call_through(fn, *args)``.
    """
    if sys.version_info >= (3, 11):
        return Instr("PUSH_NULL")
    return Instr("LOAD_CONST", call_through)


def keep_exception_depths(code, instrs, original_of: dict) -> None:
    """Give each ``TryBegin`` the stack depth of ``code``'s exception-table entry it starts."""
    entries = getattr(dis.Bytecode(code), "exception_entries", None) or []
    for k, instr in enumerate(instrs):
        if isinstance(instr, TryBegin):
            first = next(i for i in instrs[k:] if isinstance(i, Instr))
            offset = original_of[id(first)].offset
            instr.stack_depth = next(e.depth for e in entries if e.start <= offset < e.end)


def reenter_with(name: str, args: tuple, handler_310) -> list:
    """``with <name>(*args):`` up to its body: the call, then BEFORE_WITH (3.10: SETUP_WITH,
    whose handler is the original block's), dropping the ``__enter__`` result."""
    consts = [Instr("LOAD_CONST", a) for a in args]
    n = len(args)
    if sys.version_info >= (3, 13):
        call = [Instr("LOAD_FAST", name), Instr("PUSH_NULL"), *consts, Instr("CALL", n)]
    elif sys.version_info >= (3, 12):
        call = [Instr("PUSH_NULL"), Instr("LOAD_FAST", name), *consts, Instr("CALL", n)]
    elif sys.version_info >= (3, 11):
        call = [Instr("PUSH_NULL"), Instr("LOAD_FAST", name), *consts, Instr("PRECALL", n),
                Instr("CALL", n)]
    else:
        call = [Instr("LOAD_FAST", name), *consts, Instr("CALL_FUNCTION", n)]
    if sys.version_info < (3, 11):
        return call + [Instr("SETUP_WITH", handler_310), Instr("POP_TOP")]
    return call + [Instr("BEFORE_WITH"), Instr("POP_TOP")]


def with_handlers_310(real, originals, offset) -> list:
    """3.10: the handler labels of the ``with`` blocks around ``offset``, outermost first
    (3.11+ finds them in the exception table; nothing to do)."""
    if sys.version_info >= (3, 11):
        return []
    around = [(inst.offset, instr.arg) for inst, instr in zip(originals, real)
              if inst.opname == "SETUP_WITH" and inst.offset < offset < inst.argval]
    return [label for _, label in sorted(around, key=lambda pair: pair[0])]


def make_resume_function(fn: types.FunctionType, offset: int, nulls: list,
                         local_names: list[str]) -> types.FunctionType:
    """A function object for the resume code, sharing ``fn``'s globals and closure cells."""
    code = make_resume_code(fn.__code__, offset, nulls, local_names)
    key = (code, id(fn.__globals__), tuple(map(id, fn.__closure__ or ())))
    if key not in _FUNCTIONS:
        _FUNCTIONS[key] = types.FunctionType(code, fn.__globals__, code.co_name, None,
                                             fn.__closure__)
    return _FUNCTIONS[key]
