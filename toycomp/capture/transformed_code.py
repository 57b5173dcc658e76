"""The transformed function: what runs instead of ``fn``, written as readable Python.

From a finished trace (toycomp/capture/symbolic_convert.py's ``Return`` or ``Break``) this module
writes the function that replaces ``fn`` for inputs that pass the guards. For ``f`` below, traced
on a tensor, it prints as::

    def f(x):                        def __transformed_f(x):
        y = x.sin()                      __graph_out = __compiled_fn_0(x)
        LOG.append(1)                    __callee = B['print']
        print(y)                         __arg0 = __graph_out[0]
        return y.cos()                   __local_x = x
                                         __local_y = __graph_out[0]
                                         G['LOG'].append(1)
                                         # graph break at f.py:4: print() is a graph break
                                         __result = __callee(__arg0)
                                         return __resume_at_30(__result, __local_x, __local_y)

1. call graph 0 (the torch operations traced so far, compiled by the backend);
2. rebuild the frame's live values (stack and locals) from the graph's outputs, sources and
   constants; 3. replay the side effects, in program order; 4. run the instruction that broke
the graph in plain Python; 5. continue in the resume function, captured lazily on its first call.

NB: in PyTorch this lives in torch/_dynamo/output_graph.py (``compile_and_call_fx_graph``,
``codegen_suffix``) and symbolic_convert.py (``create_call_resume_at``); Dynamo writes bytecode,
which ``depyf`` can decompile to text like the above.
"""

from __future__ import annotations

import builtins
import inspect
import re
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from toycomp.capture.codegen import PyCodegen
from toycomp.capture.resume_execution import ReenterWith, make_resume_function
from toycomp.capture.sources import ChainedSource, Source
from toycomp.capture.symbolic_convert import Break, Return
from toycomp.capture.variables.base import NULL
from toycomp.capture.variables.functions import UserFunctionVariable, UserMethodVariable
from toycomp.capture.variables.objects import NNModuleVariable
from toycomp.capture.variables.torch import WithExitFunctionVariable


@dataclass
class TransformedCode:
    """The transformed function, its Python text, and the graph it calls (if any)."""

    fn: Callable
    source: str
    graph_module: Any = None  # torch.fx.GraphModule, or None when no torch op was traced
    example_inputs: list = field(default_factory=list)
    resume_functions: dict = field(default_factory=dict)  # name -> function


def signature_text(code: types.CodeType) -> str:
    """``code``'s parameter list, without defaults: ``x, n, *args, scale, **kwargs``."""
    bare = types.FunctionType(code, {}, None, None, tuple(map(types.CellType, code.co_freevars)))
    return str(inspect.signature(bare))[1:-1]


# [Note: build_transformed's arguments]
# ``fn`` is a function or resume function; ``plan`` the translator's ``Return`` or ``Break``,
# ``output`` its OutputGraph; ``context`` the CompileContext (convert_frame.py) whose
# ``compile_graph`` is the backend, ``(gm, example_fake_inputs) -> callable``, whose
# ``frame_for`` compiles resume functions, and whose ``log`` numbers the graphs
# (``__compiled_fn_<k>``: k graphs were compiled before).
def build_transformed(fn, plan, output, context) -> TransformedCode:
    """The transformed function for one trace of ``fn`` (see the Note above)."""
    cg = PyCodegen(output.shapes.symbols)  # cg.lines: the body, in order
    tail, resume = rebuild_frame(fn, plan, cg, context.frame_for)
    for record in output.side_effects.records:  # Python side effects, replayed after the graph
        cg.lines.append(record.codegen(cg))
    head, gm, examples = call_graph(output, cg, context)
    name = "__transformed_" + re.sub(r"\W", "_", fn.__code__.co_name)  # <lambda>: _lambda_
    body = "".join(f"    {line}\n" for line in head + cg.lines + tail)
    source = f"def {name}({signature_text(fn.__code__)}):\n{body}"
    env = cg.env | resume | {"G": fn.__globals__, "B": vars(builtins), "F": fn,
                             "__compile_frame": context.frame_for}
    exec(compile(source, f"<toycomp transformed {fn.__code__.co_name}>", "exec"), env)
    new_fn = env[name]
    new_fn.__defaults__, new_fn.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
    return TransformedCode(new_fn, source, gm, examples, resume)


def call_graph(output, cg, context) -> tuple[list[str], Any, list]:
    """The lines calling the compiled graph, the GraphModule, its inputs (``cg.outputs`` known)."""
    if not output.count_calls():
        return [], None, []
    gm = output.graph_module(list(cg.outputs.values()))
    sources = gm.meta["input_sources"] = list(output.graph_inputs)  # each placeholder's source
    examples = output.example_inputs()
    index = sum(r.transformed.graph_module is not None for r in context.log)  # graphs before
    cg.env[f"__compiled_fn_{index}"] = context.compile_graph(gm, examples)
    call = f"{'__graph_out = ' if cg.outputs else ''}__compiled_fn_{index}"
    if any(isinstance(s, ChainedSource) for s in sources):  # attributes, items: read_inputs
        paths, inputs = read_inputs(sources, output.guards.lean)
        return paths + call_lines(call, inputs), gm, examples
    return [f"{call}({', '.join(s.code() for s in sources)})"], gm, examples


# [Note: graph inputs read as the guards read them]
# The transformed function runs right after its guards passed, on the same frame (on the first
# call, right after the trace that made the guards from it), and reads its graph inputs first,
# before any replayed side effect or user code. So it may read them as the guards do:
# ``m._parameters['weight']`` for ``m.weight`` where the guards checked that this is the same
# read (the module's ``type(m) is Conv2d`` and ``'weight' not in m.__dict__`` lines:
# [Note: guards read nn.Module attributes from its dicts], sources.py). ``GuardBuilder.lean``
# gives that source, and adds those lines if a guard did not already need them (the guards are
# compiled after this function is written). Through nn.Module.__getattr__ each read costs
# 0.7 us, and MobileNet-v2 has 262 graph inputs under 160 modules: its inputs took 178 us a
# call to read on the 2-core CPU, and take 15 us this way. Where the reads of two or more
# inputs part, the path to there is read once and named (``__path3 = __path1['2']._parameters``),
# much as the guards name shared prefixes ([Note: guards name shared prefixes], guard_check.py).
# An input read other than as written is commented with its source (``__path0['weight'],  #
# self.weight``); a call whose inputs all read as written stays on one line, as for a function of
# tensors only: ``__compiled_fn_0(x.size(0), x)``.
def read_inputs(sources: list[Source], lean: Callable[[Source], Source] = lambda s: s,
                ) -> tuple[list[str], list[tuple[str, str]]]:
    """Lines that read each path where the reads of two or more graph inputs part once
    (``__path0 = self._modules['encoder']._modules``), and each input as (its text, its source
    as written), read through ``lean`` (see [Note: graph inputs read as the guards read them])."""
    leans = [lean(s) for s in sources]
    children: dict[Source, set[Source]] = {}  # a path -> the longer paths that continue it
    for source in leans:
        for child, path in zip([source, *_prefixes(source)], _prefixes(source)):
            children.setdefault(path, set()).add(child)
    names: dict[Source, str] = {}

    def text(source: Source) -> str:
        if source in names:
            return names[source]
        if isinstance(source, ChainedSource):
            return text(source.base) + source.suffix()
        return source.code()

    lines = []
    inputs = set(leans)
    for source in leans:  # in the inputs' order, each path after its prefixes
        for path in reversed(_prefixes(source)):
            if path not in names and (len(children[path]) >= 2 or path in inputs):
                lines.append(f"__path{len(names)} = {text(path)}")
                names[path] = f"__path{len(names)}"
    return lines, [(text(s), w.code()) for s, w in zip(leans, sources)]


def _prefixes(source: Source) -> list[Source]:
    """The chained sources that ``source`` continues, longest first."""
    found, base = [], getattr(source, "base", None)
    while isinstance(base, ChainedSource):
        found.append(base)
        base = base.base
    return found


def call_lines(call: str, inputs: list[tuple[str, str]]) -> list[str]:
    """``call(inputs)`` on one line when every input reads as written, else one input a line,
    commented with its source where it reads otherwise."""
    if all(read == written for read, written in inputs):
        return [f"{call}({', '.join(read for read, _ in inputs)})"]
    return [f"{call}(", *(f"    {read},{'' if read == written else f'  # {written}'}"
                          for read, written in inputs), ")"]


def rebuild_frame(fn, plan, cg, frame_compiler) -> tuple[list[str], dict]:
    """The transformed function's last lines, and the resume functions they call."""
    if isinstance(plan, Return):
        return [f"return {cg.bind(cg.reconstruct(plan.value), '__return_value')}"], {}
    return resume_at_break(fn, plan, cg, frame_compiler)


def resume_at_break(fn, plan, cg, frame_compiler) -> tuple[list[str], dict]:
    """At a graph break: rebuild the stack and the live locals, run the instruction that broke
    the graph in plain Python, and return what the resume function(s) return."""
    stack, nulls = [], []  # the rebuilt stack's names; the resume function's stack layout
    for i, v in enumerate(plan.stack):
        if isinstance(v, WithExitFunctionVariable):  # the resume function enters it again
            factory, args = v.ctx.reenter()
            stack.append(cg.bind(cg.constant(factory), f"__next_stack{i}"))
            nulls.append(ReenterWith(tuple(args)))
        else:
            # (not ``__stack{i}``: a resume function's own parameters, which later lines read)
            stack.append(v if v is NULL else cg.bind(cg.reconstruct(v), f"__next_stack{i}"))
            nulls.append(v is NULL)
    tail = [f"# graph break at {plan.location[0]}:{plan.location[1]}: {plan.reason}"
            if plan.location else f"# graph break: {plan.reason}"]
    if plan.kind == "call":
        tail += call_at_break(plan, cg)
        if plan.pushes:
            stack.append("__result")
            nulls.append(False)
    live = {n: v for n, v in plan.locals.items() if not n.startswith("__stack")}  # prefix args
    locals_ = {name: cg.bind(cg.reconstruct(v), f"__local_{name}") for name, v in live.items()}
    locals_ |= {name: cg.bind(cg.reconstruct(v), f"__cell_{name}")
                for name, v in plan.cells.items()}
    args = ", ".join([s for s in stack if s is not NULL] + list(locals_.values()))
    resume = {}
    for offset in plan.resume_offsets:
        resume_fn = make_resume_function(fn, offset, nulls, list(locals_))
        name = resume_fn.__code__.co_name
        resume[name] = resume_fn if plan.kind == "step" else frame_compiler(resume_fn)
    names = list(resume)
    if plan.kind == "jump":
        cond = cg.bind(cg.reconstruct(plan.condition), "__condition")
        tail += [f"if {cond}:", f"    return {names[0]}({args})", f"return {names[1]}({args})"]
    else:
        tail.append(f"return {names[0]}({args})")
    return tail, resume


def call_at_break(plan, cg) -> list[str]:
    """Lines that make the call that broke the graph, in plain Python: ``__result = f(...)``,
    inside the ``with`` blocks that were open there (entered again: the graph left them)."""
    callee, args, kwargs = plan.call
    call_expr = callable_expr(cg, callee)
    parts = [cg.bind(cg.reconstruct(a), f"__arg{i}") for i, a in enumerate(args)]
    parts += [f"{k}={cg.bind(cg.reconstruct(v), f'__kwarg_{k}')}" for k, v in kwargs.items()]
    call = f"{'__result = ' if plan.pushes else ''}{call_expr}({', '.join(parts)})"
    contexts = [v.ctx.reenter() for v in plan.stack if isinstance(v, WithExitFunctionVariable)]
    if not contexts:
        return [call]
    entered = ", ".join(f"{cg.constant(factory)}({', '.join(cg.constant(a) for a in args)})"
                        for factory, args in contexts)
    return [f"with {entered}:", f"    {call}"]


def callable_expr(cg, callee) -> str:
    """The called value at a break; Python functions are wrapped to be captured as frames."""
    if isinstance(callee, (UserFunctionVariable, UserMethodVariable)):
        fn = cg.bind(reconstruct_function(cg, callee), "__callee")
        return f"__compile_frame({fn})"
    if isinstance(callee, NNModuleVariable) and callee.source is not None and not (
            callee.value._forward_hooks or callee.value._forward_pre_hooks):
        return f"__compile_frame({cg.bind(cg.reconstruct(callee), '__callee')}.forward)"
    return cg.bind(cg.reconstruct(callee), "__callee")


def reconstruct_function(cg, var) -> str:
    fn = var.source.code() if var.source is not None else cg.constant(var.fn)
    if isinstance(var, UserMethodVariable):
        return f"{cg.constant(types.MethodType)}({cg.constant(var.fn)}, {cg.reconstruct(var.obj)})"
    return fn
