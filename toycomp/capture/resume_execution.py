"""Resume functions: a code object that continues ``fn`` from one instruction.

After a graph break, the rest of ``fn`` (from the instruction after the break) must run and be
captured in turn. A resume function is a copy of ``fn``'s bytecode with a short prefix: its
arguments are the values that were on the stack and in the locals at the break; the prefix
pushes the stack values back and jumps to the instruction where ``fn`` left off::

    def f(x):                          __resume_at_30(__stack0, x):   # bytecode, as Python:
        y = x.sin()                        <push __stack0>
        print(y)        <- break           jump to offset 30 (after print's CALL)
        return y.cos()                     ... f's own bytecode from there: POP_TOP, return y.cos()

Its bytecode is made with the ``bytecode`` package, which keeps labels, exception tables and
line numbers right when instructions are inserted. Resume functions are cached by (code,
offset, stack layout, argument names), so a recompile reuses them.

>>> stack_arg_names([False, True, False])  # the stack at the break held a NULL in the middle
['__stack0', '__stack2']

NB: in PyTorch this lives in torch/_dynamo/resume_execution.py (ContinueExecutionCache,
``generate`` / ``ResumeFunctionMetadata``); Dynamo also re-enters ``with`` blocks, toycomp refuses
breaks inside them.
"""

from __future__ import annotations

import dis
import inspect
import sys
import types

from bytecode import Bytecode, Instr, Label

_CACHE: dict[tuple, types.CodeType] = {}
_ORIGIN: dict[types.CodeType, tuple[types.CodeType, int]] = {}  # resume code -> (original, prefix)
_FUNCTIONS: dict[tuple, types.FunctionType] = {}  # (cells keyed by id; the function keeps them)


def stack_arg_names(nulls: list[bool]) -> list[str]:
    """The resume function's parameters for the stack values (NULLs are pushed, not passed)."""
    return [f"__stack{i}" for i, is_null in enumerate(nulls) if not is_null]


def make_resume_code(code: types.CodeType, offset: int, nulls: list[bool],
                     local_names: list[str]) -> types.CodeType:
    """``code`` continued at instruction ``offset`` with the stack ``nulls`` describes.

    Args:
        code: the original function's code object.
        offset: the ``dis`` offset of the instruction to continue at.
        nulls: one entry per stack value, bottom first: True where the value is a NULL.
        local_names: the locals (and cells) passed as arguments after the stack values.

    Returns:
        A code object whose positional parameters are ``__stack<i>...`` then ``local_names``.
    """
    code, offset = original_position(code, offset)
    key = (code, offset, tuple(nulls), tuple(local_names))
    if key not in _CACHE:
        _CACHE[key] = _generate(code, offset, nulls, local_names)
        prefix = len(nulls) + 1  # the pushes and the jump
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


def _generate(code, offset, nulls, local_names):
    bc = Bytecode.from_code(code)
    instrs = list(bc)
    real = [i for i in instrs if isinstance(i, Instr)]
    originals = [i for i in dis.get_instructions(code) if i.opname != "EXTENDED_ARG"]
    target = real[[i.offset for i in originals].index(offset)]
    label = Label()
    instrs.insert(next(k for k, i in enumerate(instrs) if i is target), label)
    prefix = [Instr("PUSH_NULL") if is_null else Instr("LOAD_FAST", f"__stack{i}")
              for i, is_null in enumerate(nulls)]
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
    return bc.to_code()


def make_resume_function(fn: types.FunctionType, offset: int, nulls: list[bool],
                         local_names: list[str]) -> types.FunctionType:
    """A function object for the resume code, sharing ``fn``'s globals and closure cells."""
    code = make_resume_code(fn.__code__, offset, nulls, local_names)
    key = (code, id(fn.__globals__), tuple(map(id, fn.__closure__ or ())))
    if key not in _FUNCTIONS:
        _FUNCTIONS[key] = types.FunctionType(code, fn.__globals__, code.co_name, None,
                                             fn.__closure__)
    return _FUNCTIONS[key]
