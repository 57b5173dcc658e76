"""The opcode table, continued: calls, functions, jumps, loops, ``with`` and generators.

Registers its handlers in ``HANDLERS`` (toycomp/capture/instructions.py, whose docstring has the
table of how each Python version's opcodes are handled). ``pop_call_operands`` is shared with the
graph break at a call, which pops the same operands to run the call in plain Python.

>>> "FOR_ITER" in HANDLERS and "CALL" in HANDLERS
True

NB: in PyTorch this lives in torch/_dynamo/symbolic_convert.py (``CALL``, ``FOR_ITER``,
``generic_jump``, ``BEFORE_WITH``, ...).
"""

from __future__ import annotations

import inspect

from toycomp.capture.instructions import HANDLERS, PY, handles
from toycomp.capture.variables.base import NULL, ConstantVariable, Unsupported
from toycomp.capture.variables.classes import UserContextManagerVariable
from toycomp.capture.variables.functions import NestedUserFunctionVariable
from toycomp.capture.variables.lists import as_iterator
from toycomp.capture.variables.torch import WithExitFunctionVariable


# ----- calls --------------------------------------------------------------------------------

CALL_OPS = ("CALL", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_METHOD", "CALL_KW",
            "CALL_FUNCTION_EX")


def pop_call_operands(tx, inst):
    """A call's operands, ``(callable, args, kwargs)``, popped in this version's layout."""
    if inst.opname == "CALL_FUNCTION_EX":  # f(*args, **kwargs)
        return pop_call_ex_operands(tx, inst)
    names, tx.kw_names = tx.kw_names or (), None  # keywords' names: 3.11-3.12's KW_NAMES
    if inst.opname in ("CALL_FUNCTION_KW", "CALL_KW"):  # or on the stack (3.10, 3.13)
        names = tx.pop().as_python_constant()
    args = tx.popn(inst.arg)
    if inst.opname in ("CALL_FUNCTION", "CALL_FUNCTION_KW"):  # 3.10: the callable alone
        fn = tx.pop()
    else:  # 3.10 CALL_METHOD, 3.11+ CALL: the callable, with NULL or the method's self
        fn, self_or_null = pop_callable_and_self(tx)
        args = args if self_or_null is NULL else [self_or_null, *args]
    split = len(args) - len(names)
    return fn, args[:split], dict(zip(names, args[split:]))


def pop_callable_and_self(tx):
    below, top = tx.popn(2)  # 3.10 CALL_METHOD / 3.11-12 CALL: NULL or method lies below
    if PY >= (3, 13):
        return below, top
    return (top, NULL) if below is NULL else (below, top)


def pop_call_ex_operands(tx, inst):
    kwargs = tx.pop().items if inst.arg & 1 else {}
    args = tx.pop().unpack_var_sequence(tx)
    if PY >= (3, 13):
        tx.pop()  # NULL or self above the callable
    fn = tx.pop()
    if (3, 11) <= PY < (3, 13) and tx.stack and tx.stack[-1] is NULL:
        tx.pop()
    return fn, list(args), dict(kwargs)


@handles(*CALL_OPS)
def call_op(tx, inst):
    fn, args, kwargs = pop_call_operands(tx, inst)
    tx.push(fn.call_function(tx, args, kwargs))


@handles("KW_NAMES")
def kw_names(tx, inst):
    tx.kw_names = tx.code.co_consts[inst.arg]  # (3.11's dis leaves argval unresolved)


@handles("PUSH_NULL")
def push_null(tx, inst):
    tx.push(NULL)


@handles("MAKE_FUNCTION")
def make_function(tx, inst):
    if PY <= (3, 10):
        tx.pop()  # the qualified name
    code = tx.pop().as_python_constant()
    flags = inst.arg or 0
    closure = tx.pop().unpack_var_sequence(tx) if flags & 0x08 else ()
    if flags & 0x04:
        tx.pop()  # annotations
    kwdefaults = tx.pop().items if flags & 0x02 else {}
    defaults = tx.pop().unpack_var_sequence(tx) if flags & 0x01 else []
    qualname = code.co_qualname if PY >= (3, 11) else code.co_name
    tx.push(NestedUserFunctionVariable(code, tx.f_globals, list(defaults), dict(kwdefaults),
                                       list(closure), qualname))


@handles("SET_FUNCTION_ATTRIBUTE")
def set_function_attribute(tx, inst):
    fn, value = tx.pop(), tx.pop()
    if inst.arg == 0x08:
        fn.closure = list(value.unpack_var_sequence(tx))
    elif inst.arg == 0x02:
        fn.kwdefaults = dict(value.items)
    elif inst.arg == 0x01:
        fn.defaults = list(value.unpack_var_sequence(tx))
    tx.push(fn)


@handles("RETURN_VALUE")
def return_value(tx, inst):
    tx.do_return(tx.pop())


@handles("RETURN_CONST")
def return_const(tx, inst):
    tx.do_return(ConstantVariable(inst.argval))


# ----- jumps and loops ------------------------------------------------------------------------

@handles("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP")
def jump(tx, inst):
    tx.jump(inst)


POP_JUMPS = {  # opname suffix -> does the popped value make it jump?
    "IF_TRUE": lambda tx, v: v.truth(tx),
    "IF_FALSE": lambda tx, v: not v.truth(tx),
    "IF_NONE": lambda tx, v: v.is_python_constant() and v.as_python_constant() is None,
    "IF_NOT_NONE": lambda tx, v: not (v.is_python_constant() and v.as_python_constant() is None),
}


def pop_jump(tx, inst):
    """``if``/``while`` on a popped value; a tensor value raises Unsupported (a graph break)."""
    suffix = inst.opname[inst.opname.index("_IF_") + 1:]
    if POP_JUMPS[suffix](tx, tx.pop()):
        tx.jump(inst)


for _dir in ("", "FORWARD_", "BACKWARD_"):
    for _suffix in POP_JUMPS:
        HANDLERS[f"POP_JUMP_{_dir}{_suffix}"] = pop_jump


@handles("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP")
def jump_or_pop(tx, inst):
    truth = tx.stack[-1].truth(tx)
    if truth == (inst.opname == "JUMP_IF_TRUE_OR_POP"):
        tx.jump(inst)
    else:
        tx.pop()


@handles("GET_ITER")
def get_iter(tx, inst):
    tx.push(as_iterator(tx, tx.pop()))


@handles("FOR_ITER")
def for_iter(tx, inst):
    item = tx.stack[-1].next_item()
    if item is not None:
        tx.push(item)
        return
    tx.pop()
    tx.jump(inst)
    tx.ip += {(3, 12): 1}.get(PY, 2 if PY >= (3, 13) else 0)  # skip END_FOR (and POP_TOP)


@handles("END_FOR")
def end_for(tx, inst):
    tx.popn(2 if PY == (3, 12) else 1)


# ----- with blocks ----------------------------------------------------------------------------

@handles("BEFORE_WITH", "SETUP_WITH")
def before_with(tx, inst):
    ctx = tx.pop()
    if UserContextManagerVariable.wraps(ctx):  # __enter__/__exit__ in Python: inlined
        ctx = UserContextManagerVariable(ctx)
    if not hasattr(ctx, "enter"):
        raise Unsupported(f"`with` on {ctx}")
    in_try = tx.in_try(inst) if hasattr(tx, "in_try") else False  # (root frame only)
    tx.push(WithExitFunctionVariable(ctx, in_try))
    tx.push(ctx.enter(tx))
    if inst.opname == "SETUP_WITH":
        tx.blocks.append("with")


@handles("SETUP_FINALLY")
def setup_finally(tx, inst):
    tx.blocks.append("try")


@handles("POP_BLOCK")
def pop_block(tx, inst):
    tx.blocks.pop()


# ----- generators (run lazily, to the next yield as each item is taken) ----------------------

@handles("RETURN_GENERATOR")
def return_generator(tx, inst):
    tx.push(ConstantVariable(None))  # what the POP_TOP after it removes


@handles("YIELD_VALUE")
def yield_value(tx, inst):
    """Pause the generator's frame (see [Note: generators run lazily] in variables/lists.py)."""
    if not tx.code.co_flags & inspect.CO_GENERATOR:
        raise Unsupported("yield outside a generator")
    tx.yielded = tx.pop()
    tx.push(ConstantVariable(None))  # the value sent back in


@handles("LOAD_ASSERTION_ERROR", "RAISE_VARARGS")
def raise_(tx, inst):
    raise Unsupported("raising an exception")
