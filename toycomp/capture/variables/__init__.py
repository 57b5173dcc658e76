"""Variable trackers: what the bytecode interpreter holds instead of real Python values.

Files in reading order: base.py (VariableTracker, ValueVariable, ConstantVariable,
Unsupported), tensor.py (TensorVariable: an FX node + a fake tensor), lists.py (lists, tuples,
dicts, iterators), sets.py (sets of constants), functions.py (user functions, inlined),
objects.py (nn.Modules, user objects, super()), nn_module_iter.py (a module's children() and
modules()), classes.py (user classes, the objects they
make while tracing), builtin.py (len, isinstance,
operators), iter.py (itertools, functools), torch.py (torch functions, no_grad, autocast) and
builder.py (a real value + its source -> a tracker + guards).

NB: in PyTorch this lives in torch/_dynamo/variables/.
"""
