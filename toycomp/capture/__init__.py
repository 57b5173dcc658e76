"""Stage 1, capture: a Python function + example inputs -> a torch-level FX graph + guards.

Input: ``fn`` (a function or ``nn.Module``) and example arguments. Output IR: torch-level
``torch.fx.GraphModule``s whose nodes call torch functions, operators and tensor methods, each
with the guards under which it may be reused, and the transformed function that calls them. The
bytecode of ``fn`` is interpreted on fake tensors, as TorchDynamo does: what cannot be traced
is a graph break, and the rest of ``fn`` continues in a resume function, captured in turn.

    >>> import torch
    >>> from toycomp.capture.captured_graph import capture_graph
    >>> captured = capture_graph(lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2, torch.randn(8))
    >>> [node.name for node in captured.gm.graph.nodes]
    ['l_x', 'sin', 'pow_1', 'cos', 'pow_2', 'add', 'output']

Files, in reading order:

    convert_frame.py       ``compile_frame``: the per-function cache of guarded entries
    symbolic_convert.py    ``InstructionTranslator``: the root frame, where the graph breaks
    translator_base.py     what every frame shares: a value stack and locals of variable trackers
    instructions.py        the opcode table (Python 3.10-3.13): locals, the stack, operators
    instructions_containers.py  subscripts, containers, attributes, f-strings
    instructions_flow.py   calls, functions, jumps, loops, ``with``, generators
    variables/             the variable trackers (tensors, constants, lists, modules, functions...)
    sources.py             where each value came from; guard_builder.py: guards from the sources;
                           guard_check.py: the guards compiled into one function
    dynamic_shapes.py      automatic dynamic shapes: which sizes become symbols; shape guards
    output_graph.py        the FX graph, built on fake tensors
    side_effects_replay.py Python mutations recorded while tracing, replayed after the graph
    codegen.py             traced values back into Python expressions
    resume_execution.py    resume functions: the rest of a frame after a graph break
    transformed_code.py    the function that runs instead of fn, as readable Python text
    captured_graph.py      ``capture_graph``: one function -> its one graph (notebooks 02, 03)

Notebook 01 starts from a naive run-once tracer (a ``TorchFunctionMode``) to show why a
compiler must read the bytecode.

NB: in PyTorch this lives in torch/_dynamo/ (symbolic_convert.py interprets the bytecode,
output_graph.py builds the graph, guards.py and torch/_guards.py the guards, side_effects.py
replays Python side effects, trace_rules.py and variables/ decide what is traced).
"""
