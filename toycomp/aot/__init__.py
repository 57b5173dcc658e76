"""Stage 2, AOTAutograd: a torch-level graph -> ATen-level joint, forward and backward graphs.

Input: a callable on flat tensors (the captured ``GraphModule``, or any function) and real
example tensors. Output IR: ATen-level ``torch.fx.GraphModule``s, every node with ``meta["val"]``:
the *joint* graph (forward and backward traced together, in-place ops made functional), split
into a *forward* and a *backward* graph and the values saved between them; and an ``AOTOutput``
that runs the compiled pair inside a ``torch.autograd.Function``.

    >>> import torch
    >>> from toycomp.aot.aot_autograd import aot_function
    >>> x = torch.randn(8, requires_grad=True)
    >>> aot = aot_function(lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2, [x])
    >>> aot.saved_values                  # what the forward keeps for the backward
    ['primals_1', 'sin', 'cos']
    >>> type(aot(x)[0].grad_fn).__name__  # the whole function is one autograd node
    'CompiledFunctionBackward'

Files, in reading order:

    aot_autograd.py      ``trace_joint``, ``trace_forward``, ``aot_function``: the entry points
    functionalize.py     ``FunctionalRecorder``: records ATen ops, in-place ones made functional
    tensor_tracker.py    ``TensorTracker``: which node holds each real tensor's current value
    functional_utils.py  which ops write to what (from their schemas); tensors as memory
    compile_utils.py     ``fx_graph_cse``: merge duplicate pure calls of the joint graph
    partitioners.py      ``default_partition``, ``min_cut_rematerialization_partition``
    runtime_wrappers.py  ``AOTOutput`` and ``CompiledFunction``: run the compiled pair

NB: in PyTorch this lives in torch/_functorch/aot_autograd.py, torch/_functorch/_aot_autograd/
(traced_function_transforms.py, collect_metadata_analysis.py, functional_utils.py,
runtime_wrappers.py), torch/_functorch/partitioners.py and compile_utils.py, over make_fx
(torch/fx/experimental/proxy_tensor.py) and FunctionalTensorMode
(torch/_subclasses/functional_tensor.py).
"""
