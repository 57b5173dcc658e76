"""The opcode table: bytecode instruction name -> how the symbolic interpreter runs it.

Each handler takes the translator ``tx`` and one ``dis.Instruction`` and moves variable trackers
between ``tx.stack`` and ``tx.symbolic_locals``, exactly as CPython's ``ceval`` moves real values.
An opcode missing from ``HANDLERS`` is a graph break whose reason names it. This module has the
table itself and the instructions on locals, globals, cells, the stack and operators;
toycomp/capture/instructions_containers.py registers subscripts, containers, attributes and
f-strings, and toycomp/capture/instructions_flow.py calls, jumps, loops, ``with`` and generators.

>>> import dis
>>> sorted(op for op in HANDLERS if op.startswith("LOAD_F"))[:3]
['LOAD_FAST', 'LOAD_FAST_AND_CLEAR', 'LOAD_FAST_CHECK']

How each Python version's bytecode is handled (one table, keyed by opname; ``dis`` already turns
every jump's argument into an absolute target offset, ``inst.argval``, in every version):

=================================  ======  ============================================
opnames                            python  handling
=================================  ======  ============================================
BINARY_ADD, INPLACE_ADD, ...       3.10    one ``operator`` function per opcode
BINARY_OP (argrepr '+', '+=')      3.11+   ``BINARY_OPS[argrepr]``
CALL_FUNCTION[_KW], CALL_METHOD    3.10    callable below the arguments; LOAD_METHOD pushes
                                           (NULL, fn) or (method, self)
PRECALL + CALL, KW_NAMES           3.11    NULL *below* the callable (PUSH_NULL, LOAD_GLOBAL
                                           with arg & 1); PRECALL does nothing here
CALL, KW_NAMES; LOAD_ATTR arg & 1  3.12    as 3.11 without PRECALL; LOAD_METHOD folded into
                                           LOAD_ATTR; LOAD_SUPER_ATTR for ``super().x``
CALL, CALL_KW                      3.13    NULL *above* the callable (``callable,
                                           self_or_null, args``); names on the stack
POP_JUMP_IF_* (absolute)           3.10    ``inst.argval`` is the target
POP_JUMP_FORWARD/BACKWARD_IF_*     3.11    same handler as POP_JUMP_IF_*
POP_JUMP_IF_*, TO_BOOL             3.12+   TO_BOOL keeps a tensor on the stack, so the jump
                                           breaks the graph (not the conversion)
FOR_ITER                           3.10-11 exhausted: pop the iterator, jump to target
FOR_ITER, END_FOR                  3.12    exhausted: pop, jump past END_FOR
FOR_ITER, END_FOR, POP_TOP         3.13    exhausted: pop, jump past END_FOR and POP_TOP
ROT_N, DUP_TOP[_TWO]               3.10    stack shuffles
COPY, SWAP                         3.11+   stack shuffles
SETUP_WITH, SETUP_FINALLY,         3.10    ``with`` / ``try`` on a block stack; a resume
POP_BLOCK                                 function re-enters ``with`` with SETUP_WITH
BEFORE_WITH                        3.11+   ``with``; the exception table tells ``try``
                                          blocks (no break resumes inside them)
MAKE_FUNCTION (flags)              3.10-12 3.10 also pops the qualname
MAKE_FUNCTION, SET_FUNCTION_ATTR.  3.13    flags set one by one
FORMAT_VALUE                       3.10-12 f-strings
FORMAT_SIMPLE/WITH_SPEC, CONVERT_  3.13    f-strings
LOAD_FAST_AND_CLEAR, ..._CHECK     3.12+   inlined comprehensions (PEP 709)
LOAD_FAST_LOAD_FAST, STORE_FAST_*  3.13    two locals in one instruction
RETURN_CONST, BINARY/STORE_SLICE   3.12+
=================================  ======  ============================================

CI runs 3.11; tests/capture also passes on 3.10.13 and 3.13.0 (torch 2.13, run by hand with
``PYTHONPATH=. python -m pytest tests/capture``); 3.12's rows follow CPython's ``dis`` docs.

NB: in PyTorch this lives in torch/_dynamo/symbolic_convert.py (one method per opcode on
InstructionTranslatorBase, e.g. ``def LOAD_FAST(self, inst)``).
"""

from __future__ import annotations

import importlib
import operator
import sys

from toycomp.capture.variables.base import NULL, ConstantVariable, Unsupported
from toycomp.capture.variables.builtin import BuiltinVariable
from toycomp.capture.variables.lists import TupleVariable
from toycomp.capture.variables.tensor import TensorVariable

PY = sys.version_info[:2]
BINARY_OPS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "<<": operator.lshift, ">>": operator.rshift, "&": operator.and_, "|": operator.or_,
    "^": operator.xor,
}
BINARY_OPS |= {
    k + "=": getattr(operator, "i" + v.__name__.rstrip("_")) for k, v in BINARY_OPS.items()
}
NAMES_310 = {"ADD": "+", "SUBTRACT": "-", "MULTIPLY": "*", "TRUE_DIVIDE": "/",
             "FLOOR_DIVIDE": "//", "MODULO": "%", "POWER": "**", "MATRIX_MULTIPLY": "@",
             "LSHIFT": "<<", "RSHIFT": ">>", "AND": "&", "OR": "|", "XOR": "^"}
COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
               ">": operator.gt, ">=": operator.ge}
HANDLERS = {}


def handles(*names):
    def register(fn):
        for name in names:
            HANDLERS[name] = fn
        return fn
    return register


def unsupported_opcode(tx, inst):
    """An opcode with no handler: a graph break that names it."""
    raise Unsupported(f"opcode {inst.opname} is not supported by toycomp (Python {PY[0]}.{PY[1]})")


def builtin(tx, fn, *args):
    """``fn(*args)`` on trackers, through its rule (``operator.add`` of two tensors: a node)."""
    return BuiltinVariable(fn).call_function(tx, list(args), {})


# ----- do-nothing instructions --------------------------------------------------------------

@handles("NOP", "RESUME", "PRECALL", "MAKE_CELL", "COPY_FREE_VARS", "CACHE", "EXTENDED_ARG",
         "GEN_START")
def nop(tx, inst):
    pass


# ----- locals, constants, globals, cells ----------------------------------------------------

@handles("LOAD_FAST", "LOAD_FAST_CHECK")
def load_fast(tx, inst):
    if inst.argval not in tx.symbolic_locals:
        return load_fast_cell(tx, inst)  # 3.13's cells, or a local read before assignment
    tx.push(tx.symbolic_locals[inst.argval])


def load_fast_cell(tx, inst):
    """3.13: LOAD_FAST of a cell variable loads the cell (for a closure tuple, where 3.10-3.12
    used LOAD_CLOSURE); any other local not assigned yet is an error."""
    if inst.argval not in tx.cells:
        raise Unsupported(f"local {inst.argval!r} read before assignment")
    tx.push(tx.cells[inst.argval])


@handles("LOAD_FAST_AND_CLEAR")
def load_fast_and_clear(tx, inst):
    tx.push(tx.symbolic_locals.pop(inst.argval, NULL))


@handles("LOAD_FAST_LOAD_FAST")
def load_fast_load_fast(tx, inst):
    for name in inst.argval:
        tx.push(tx.symbolic_locals[name])


@handles("STORE_FAST")
def store_fast(tx, inst):
    value = tx.pop()
    if value is NULL:  # end of an inlined comprehension: the name was unbound before
        tx.symbolic_locals.pop(inst.argval, None)
    else:
        tx.symbolic_locals[inst.argval] = value


@handles("STORE_FAST_STORE_FAST")
def store_fast_store_fast(tx, inst):
    for name in inst.argval:
        tx.symbolic_locals[name] = tx.pop()


@handles("STORE_FAST_LOAD_FAST")
def store_fast_load_fast(tx, inst):
    store, load = inst.argval
    tx.symbolic_locals[store] = tx.pop()
    tx.push(tx.symbolic_locals[load])


@handles("DELETE_FAST")
def delete_fast(tx, inst):
    tx.symbolic_locals.pop(inst.argval, None)


@handles("LOAD_CONST")
def load_const(tx, inst):
    tx.push(ConstantVariable(inst.argval))


@handles("LOAD_GLOBAL")
def load_global(tx, inst):
    if (3, 11) <= PY < (3, 13) and inst.arg & 1:  # a NULL below the global (3.11-3.12)
        tx.push(NULL)
    tx.push(tx.load_global(inst.argval))
    if PY >= (3, 13) and inst.arg & 1:  # or above it (3.13)
        tx.push(NULL)


@handles("STORE_GLOBAL")
def store_global(tx, inst):
    tx.store_global(inst.argval, tx.pop())


@handles("LOAD_DEREF", "LOAD_CLASSDEREF")
def load_deref(tx, inst):
    tx.push(tx.load_deref(inst.argval))


@handles("STORE_DEREF")
def store_deref(tx, inst):
    tx.store_deref(inst.argval, tx.pop())


@handles("LOAD_CLOSURE")
def load_closure(tx, inst):
    tx.push(tx.cells[inst.argval])


@handles("IMPORT_NAME")
def import_name(tx, inst):
    level, fromlist = (v.as_python_constant() for v in tx.popn(2))
    # as the real instruction does: ``import a.b`` gives ``a``, ``from a.b import c`` gives a.b
    module = __import__(inst.argval, tx.f_globals, None, fromlist, level)
    tx.push(tx.output.wrap(module, None, guard=False))


@handles("IMPORT_FROM")
def import_from(tx, inst):
    tx.push(tx.stack[-1].var_getattr(tx, inst.argval))


# ----- the stack ----------------------------------------------------------------------------

@handles("POP_TOP")
def pop_top(tx, inst):
    tx.pop()


@handles("COPY")
def copy(tx, inst):
    tx.push(tx.stack[-inst.arg])


@handles("SWAP")
def swap(tx, inst):
    tx.stack[-1], tx.stack[-inst.arg] = tx.stack[-inst.arg], tx.stack[-1]


@handles("ROT_TWO", "ROT_THREE", "ROT_FOUR", "ROT_N")
def rot(tx, inst):
    n = {"ROT_TWO": 2, "ROT_THREE": 3, "ROT_FOUR": 4}.get(inst.opname, inst.arg)
    tx.stack[-n:] = [tx.stack[-1], *tx.stack[-n:-1]]


@handles("DUP_TOP")
def dup_top(tx, inst):
    tx.push(tx.stack[-1])


@handles("DUP_TOP_TWO")
def dup_top_two(tx, inst):
    tx.stack += tx.stack[-2:]


# ----- operators ----------------------------------------------------------------------------

@handles("BINARY_OP")
def binary_op(tx, inst):
    b, a = tx.pop(), tx.pop()
    tx.push(builtin(tx, BINARY_OPS[inst.argrepr], a, b))


def _binary_310(opname):
    prefix, _, name = opname.partition("_")
    symbol = NAMES_310[name] + ("=" if prefix == "INPLACE" else "")

    def handler(tx, inst):
        b, a = tx.pop(), tx.pop()
        tx.push(builtin(tx, BINARY_OPS[symbol], a, b))
    return handler


for _name in NAMES_310:
    HANDLERS[f"BINARY_{_name}"] = _binary_310(f"BINARY_{_name}")
    HANDLERS[f"INPLACE_{_name}"] = _binary_310(f"INPLACE_{_name}")


@handles("COMPARE_OP")
def compare_op(tx, inst):
    b, a = tx.pop(), tx.pop()
    tx.push(builtin(tx, COMPARE_OPS[inst.argval.replace("bool(", "").rstrip(")")], a, b))


@handles("IS_OP")
def is_op(tx, inst):
    b, a = tx.pop(), tx.pop()
    tx.push(builtin(tx, operator.is_not if inst.arg else operator.is_, a, b))


@handles("CONTAINS_OP")
def contains_op(tx, inst):
    container, item = tx.pop(), tx.pop()
    found = builtin(tx, operator.contains, container, item)
    tx.push(ConstantVariable(not found.as_python_constant()) if inst.arg else found)


@handles("UNARY_NEGATIVE", "UNARY_POSITIVE", "UNARY_INVERT")
def unary(tx, inst):
    fn = {"UNARY_NEGATIVE": operator.neg, "UNARY_POSITIVE": operator.pos,
          "UNARY_INVERT": operator.invert}[inst.opname]
    tx.push(builtin(tx, fn, tx.pop()))


@handles("UNARY_NOT")
def unary_not(tx, inst):
    tx.push(ConstantVariable(not tx.pop().truth(tx)))


@handles("TO_BOOL")
def to_bool(tx, inst):
    if not isinstance(tx.stack[-1], TensorVariable):  # a tensor stays: the jump breaks
        tx.push(ConstantVariable(tx.pop().truth(tx)))


@handles("CALL_INTRINSIC_1")
def call_intrinsic_1(tx, inst):
    if inst.argrepr == "INTRINSIC_LIST_TO_TUPLE":
        tx.push(TupleVariable(tx.pop().unpack_var_sequence(tx)))
    elif inst.argrepr == "INTRINSIC_UNARY_POSITIVE":
        tx.push(builtin(tx, operator.pos, tx.pop()))
    else:
        raise Unsupported(f"CALL_INTRINSIC_1 {inst.argrepr}")
