"""The opcode table, continued: subscripts, containers, attributes and f-strings.

Registers its handlers in ``HANDLERS`` (toycomp/capture/instructions.py, whose docstring has the
table of how each Python version's opcodes are handled). Building a container makes a tracker
of trackers (``BUILD_LIST`` -> ``ListVariable``); subscripts and attribute reads ask the tracker
underneath (``var_getattr``, ``__getitem__``); an f-string is folded while its parts are
constants.

>>> from toycomp.capture.instructions import HANDLERS
>>> HANDLERS["BUILD_LIST"].__module__
'toycomp.capture.instructions_containers'
>>> from toycomp.capture.variables.base import ConstantVariable
>>> _format(None, ConstantVariable(3.14159), None, ".2f")
ConstantVariable('3.14')

NB: in PyTorch this lives in torch/_dynamo/symbolic_convert.py (``BUILD_LIST``, ``LOAD_ATTR``,
``FORMAT_VALUE``, ... on InstructionTranslatorBase).
"""

from __future__ import annotations

import operator

from toycomp.capture.instructions import PY, builtin, handles
from toycomp.capture.variables.base import NULL, ConstantVariable, Unsupported
from toycomp.capture.variables.lists import DictVariable, ListVariable, TupleVariable
from toycomp.capture.variables.sets import SetVariable, constants
from toycomp.capture.variables.objects import SuperVariable
from toycomp.capture.variables.tensor import TensorVariable
from toycomp.symbolic_shapes import specialized


# ----- containers and attributes ------------------------------------------------------------

@handles("BINARY_SUBSCR")
def binary_subscr(tx, inst):
    key, obj = tx.pop(), tx.pop()
    tx.push(builtin(tx, operator.getitem, obj, key))


@handles("BINARY_SLICE")
def binary_slice(tx, inst):
    end, start, obj = tx.pop(), tx.pop(), tx.pop()
    key = ConstantVariable(slice(start.as_python_constant(), end.as_python_constant()))
    tx.push(builtin(tx, operator.getitem, obj, key))


@handles("STORE_SUBSCR")
def store_subscr(tx, inst):
    key, obj, value = tx.pop(), tx.pop(), tx.pop()
    builtin(tx, operator.setitem, obj, key, value)


@handles("STORE_SLICE")
def store_slice(tx, inst):
    end, start, obj, value = tx.pop(), tx.pop(), tx.pop(), tx.pop()
    key = ConstantVariable(slice(start.as_python_constant(), end.as_python_constant()))
    builtin(tx, operator.setitem, obj, key, value)


@handles("DELETE_SUBSCR")
def delete_subscr(tx, inst):
    key, obj = tx.pop(), tx.pop()
    builtin(tx, operator.delitem, obj, key)


@handles("BUILD_TUPLE", "BUILD_LIST")
def build_sequence(tx, inst):
    items = tx.popn(inst.arg)
    tx.push((TupleVariable if inst.opname == "BUILD_TUPLE" else ListVariable)(items))


@handles("BUILD_MAP")
def build_map(tx, inst):
    flat = tx.popn(2 * inst.arg)
    tx.push(DictVariable({k.as_python_constant(): v for k, v in zip(flat[::2], flat[1::2])}))


@handles("BUILD_CONST_KEY_MAP")
def build_const_key_map(tx, inst):
    keys = tx.pop().as_python_constant()
    tx.push(DictVariable(dict(zip(keys, tx.popn(inst.arg)))))


@handles("BUILD_SET")
def build_set(tx, inst):
    tx.push(SetVariable(constants(tx, tx.popn(inst.arg))))


@handles("SET_ADD")
def set_add(tx, inst):
    value = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "add", [value], {})


@handles("SET_UPDATE")
def set_update(tx, inst):
    value = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "update", [value], {})


@handles("BUILD_SLICE")
def build_slice(tx, inst):
    parts = [v.as_python_constant() for v in tx.popn(inst.arg)]
    tx.push(ConstantVariable(slice(*parts)))


@handles("LIST_APPEND")
def list_append(tx, inst):
    value = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "append", [value], {})


@handles("LIST_EXTEND")
def list_extend(tx, inst):
    value = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "extend", [value], {})


@handles("MAP_ADD")
def map_add(tx, inst):
    value, key = tx.pop(), tx.pop()
    tx.stack[-inst.arg].call_method(tx, "__setitem__", [key, value], {})


@handles("DICT_UPDATE", "DICT_MERGE")
def dict_update(tx, inst):
    value = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "update", [value], {})


@handles("LIST_TO_TUPLE")
def list_to_tuple(tx, inst):
    tx.push(TupleVariable(tx.pop().unpack_var_sequence(tx)))


@handles("UNPACK_SEQUENCE")
def unpack_sequence(tx, inst):
    items = tx.pop().unpack_var_sequence(tx)
    if len(items) != inst.arg:
        raise Unsupported(f"unpacking {len(items)} values into {inst.arg}")
    tx.stack += reversed(items)


@handles("UNPACK_EX")
def unpack_ex(tx, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = tx.pop().unpack_var_sequence(tx)
    middle = ListVariable(items[before:len(items) - after])
    tx.stack += reversed([*items[:before], middle, *items[len(items) - after:]])


@handles("LOAD_ATTR")
def load_attr(tx, inst):
    attr = tx.pop().var_getattr(tx, inst.argval)
    if PY >= (3, 12) and inst.arg & 1:  # a method load: (NULL, bound) / 3.13 (bound, NULL)
        tx.stack += [attr, NULL] if PY >= (3, 13) else [NULL, attr]
    else:
        tx.push(attr)


@handles("LOAD_METHOD")
def load_method(tx, inst):
    obj = tx.pop()
    tx.stack += [NULL, obj.var_getattr(tx, inst.argval)]


@handles("LOAD_SUPER_ATTR")
def load_super_attr(tx, inst):
    self_var, cls, _super = tx.pop(), tx.pop(), tx.pop()
    attr = SuperVariable(cls.as_python_constant(), self_var).var_getattr(tx, inst.argval)
    if inst.arg & 1:
        tx.stack += [attr, NULL] if PY >= (3, 13) else [NULL, attr]
    else:
        tx.push(attr)


@handles("STORE_ATTR")
def store_attr(tx, inst):
    obj, value = tx.pop(), tx.pop()
    if not hasattr(obj, "setattr"):
        raise Unsupported(f"attribute store on {obj}")
    obj.setattr(tx, inst.argval, value)


# ----- f-strings ------------------------------------------------------------------------------

def _format(tx, value, conversion, spec):
    if isinstance(value, TensorVariable):
        raise Unsupported("formatting a tensor reads its data")
    convert = {None: lambda v: v, "s": str, "r": repr, "a": ascii}[conversion]
    text = convert(specialized(value.as_python_constant()))  # a size: its number, guarded
    return ConstantVariable(format(text, spec))


@handles("FORMAT_VALUE")
def format_value(tx, inst):
    spec = tx.pop().as_python_constant() if inst.arg & 0x04 else ""
    conversion = {0: None, 1: "s", 2: "r", 3: "a"}[inst.arg & 0x03]
    tx.push(_format(tx, tx.pop(), conversion, spec))


@handles("FORMAT_SIMPLE")
def format_simple(tx, inst):
    tx.push(_format(tx, tx.pop(), None, ""))


@handles("FORMAT_WITH_SPEC")
def format_with_spec(tx, inst):
    spec = tx.pop().as_python_constant()
    tx.push(_format(tx, tx.pop(), None, spec))


@handles("CONVERT_VALUE")
def convert_value(tx, inst):
    tx.push(_format(tx, tx.pop(), {1: "s", 2: "r", 3: "a"}[inst.arg], ""))


@handles("BUILD_STRING")
def build_string(tx, inst):
    tx.push(ConstantVariable("".join(v.as_python_constant() for v in tx.popn(inst.arg))))
