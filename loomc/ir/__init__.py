"""The lowered kernel IR: one target-neutral vocabulary that the numba and CUDA renderers share.

`module.py` holds the node kinds, `verifier.py` their well-formedness rules, `printer.py` a
readable dump and `interpret.py` the reference semantics of scalar expressions.
"""
