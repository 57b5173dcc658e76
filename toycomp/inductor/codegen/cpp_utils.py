"""C++ spellings of dtypes, prims and indices: ``CPP_TYPES``, the ``CPP_OPS`` table, ``CppPrinter``.

Input -> output: a dtype -> its C++ type; a prim name and its arguments' source text -> a C++
expression; a sympy index -> C++ index arithmetic on ``int64_t``. cpp.py's ``CppKernelCodegen``
writes kernels with them (and re-exports every name here)::

    >>> CPP_OPS["sin"]("tmp0"), CPP_OPS["maximum"]("tmp0", "tmp1"), cpp_type(torch.bfloat16)
    ('std::sin(tmp0)', 'max_propagate_nan(tmp0, tmp1)', 'uint16_t')
    >>> from toycomp.inductor.indexing import FloorDiv, r, x
    >>> CppPrinter().doprint(1000 * r + FloorDiv(x, 4))
    '1000*rindex + ((xindex) / (4))'

``max_propagate_nan``, ``bf16_to_float`` and the other helpers these spellings call are defined
in every kernel's preamble (cpp_prefix.py).

NB: in PyTorch this lives in torch/_inductor/codegen/cpp_utils.py (DTYPE_TO_CPP, CppPrinter)
and torch/_inductor/codegen/cpp.py (CppOverrides, the op spellings).
"""

from __future__ import annotations

from typing import Callable

import torch

from toycomp.inductor.codegen.common import IndentedBuffer, IndexPrinter, infix_rules

CPP_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "_Float16",
    torch.bfloat16: "uint16_t", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
}  # fmt: skip


def cpp_type(dtype: torch.dtype) -> str:
    if dtype not in CPP_TYPES:
        raise NotImplementedError(f"C++ backend: dtype {dtype} is not supported")
    return CPP_TYPES[dtype]


def cpp_convert(value: str, dtype: torch.dtype) -> str:
    """``convert_element_type``: fp16/bf16 round through the narrow type, then compute in float.

    A double goes to float first, as in eager (fp64 -> fp16 rounds twice there, through fp32)."""
    if dtype == torch.bfloat16:
        return f"bf16_to_float(float_to_bf16({value}))"
    if dtype == torch.float16:
        return f"static_cast<float>(static_cast<_Float16>(static_cast<float>({value})))"
    return f"static_cast<{cpp_type(dtype)}>({value})"


# Rule table: prim name -> C++ expression. Arguments are already named values (tmpN) or literals.
CPP_OPS: dict[str, Callable[..., str]] = {
    **infix_rules(),  # add, sub, mul, div and the comparisons
    "neg": lambda a: f"-{a}",
    "abs": lambda a: f"std::abs({a})",
    "exp": lambda a: f"std::exp({a})",
    "log": lambda a: f"std::log({a})",
    "log1p": lambda a: f"std::log1p({a})",
    "sqrt": lambda a: f"std::sqrt({a})",
    "rsqrt": lambda a: f"1 / std::sqrt({a})",
    "reciprocal": lambda a: f"1 / {a}",
    "sin": lambda a: f"std::sin({a})",
    "cos": lambda a: f"std::cos({a})",
    "tanh": lambda a: f"std::tanh({a})",
    "erf": lambda a: f"std::erf({a})",
    "floor": lambda a: f"std::floor({a})",
    "sign": lambda a: f"({a} > 0) - ({a} < 0)",  # NaN -> 0, like torch.sign
    "logical_not": lambda a: f"!{a}",
    "pow": lambda a, b: f"toycomp_pow({a}, {b})",  # integers: pow_int (cpp_prefix.py)
    "maximum": lambda a, b: f"max_propagate_nan({a}, {b})",
    "minimum": lambda a, b: f"min_propagate_nan({a}, {b})",
    "logical_and": lambda a, b: f"{a} && {b}",
    "where": lambda c, a, b: f"{c} ? {a} : {b}",
    "convert_element_type": cpp_convert,
}


def braced(out: IndentedBuffer, *sections: IndentedBuffer | list[str]) -> None:
    """``{``, the sections' lines indented, ``}``: a loop's or a function's body."""
    out.writeline("{")
    with out.indent():
        for section in sections:
            out.writelines(section.lines if isinstance(section, IndentedBuffer) else section)
    out.writeline("}")


class CppPrinter(IndexPrinter):
    floordiv = "/"  # indices are non-negative int64_t: C's truncation is floor division
    minimum, maximum = "std::min<int64_t>", "std::max<int64_t>"  # (an int literal is an int)
