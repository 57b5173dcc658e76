"""Stage 1, capture: a Python function + example inputs -> a torch-level FX graph + guards.

Input: ``fn`` (a function or ``nn.Module``) and example arguments. Output IR: a ``CapturedGraph``,
a ``torch.fx.GraphModule`` whose nodes call torch functions, operators and tensor methods, plus
the guards under which it may be reused (shapes, strides, dtypes, Python values...) and the
tensors it lifted to inputs (parameters, globals). On a construct it cannot capture it reports a
``GraphBreak`` naming it and its source line instead, and ``fn`` runs eagerly.

    >>> import torch
    >>> from toycomp.capture.tracer import capture
    >>> captured = capture(lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2, torch.randn(8))
    >>> [node.name for node in captured.gm.graph.nodes]
    ['x', 'sin', 'pow_1', 'cos', 'pow_2', 'add', 'output']
    >>> print(captured.guards[2])
    x.shape == (8,)

Files, in reading order:

    tracer.py          ``capture``: runs fn under a TorchFunctionMode, one node per torch call
    rules.py           which calls are recorded, which break the graph and why; node targets
    source_lines.py    the user's source line of each node and graph break
    side_effects.py    undoing the capture run's in-place updates and random draws
    guards.py          ``Guard``: on arguments, module flags, closed-over and global constants
    guard_compiler.py  a graph's guards compiled into one Python function
    captured_graph.py  ``CapturedGraph``: check the guards, flatten a call, rebuild the outputs

The bytecode interpreter that replaces ``tracer.py`` (a small Dynamo; tested, not yet used by
``toycomp.compile``), in reading order:

    convert_frame.py       ``compile_frame``: the per-function cache of guarded entries
    symbolic_convert.py    ``InstructionTranslator``: a value stack and locals of variable trackers
    instructions.py        the opcode table (Python 3.10-3.13): locals, the stack, operators
    instructions_containers.py  subscripts, containers, attributes, f-strings
    instructions_flow.py   calls, functions, jumps, loops, ``with``, generators
    variables/             the variable trackers (tensors, constants, lists, modules, functions...)
    sources.py             where each value came from; guard_builder.py: guards from the sources
    output_graph.py        the FX graph, built on fake tensors
    side_effects_replay.py Python mutations recorded while tracing, replayed after the graph
    codegen.py             traced values back into Python expressions
    resume_execution.py    resume functions: the rest of a frame after a graph break
    transformed_code.py    the function that runs instead of fn, as readable Python text

NB: in PyTorch this lives in torch/_dynamo/ (symbolic_convert.py interprets the bytecode,
output_graph.py builds the graph, guards.py and torch/_guards.py the guards, side_effects.py
replays Python side effects, trace_rules.py and variables/ decide what is traced).
"""
