"""Process-wide torch state an export must neither inherit from earlier exports nor leave to later ones, so
that exporting a module twice in one process (a notebook) behaves exactly as in a fresh process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def fresh_torch_state() -> Iterator[None]:
    """Clear torch's tracing and scripting caches before the export and again after it.

    Each cache below let one export change the next (issue 12):
    - the python dispatcher memoises which kernel serves each op; torch.onnx swaps the LSTM/GRU kernels for
      while-loop ones during capture without invalidating that memo, so whichever kernel an earlier export
      resolved keeps running;
    - torch.export traces that while loop through torch.compile, whose frame cached by a static export accepts
      the next export's symbolic length and pins it: a dynamic sequence came out with the first export's length;
    - a failed ``torch.jit.script`` leaves the module types it was compiling half-defined and cached by module
      class, so scripting the class again fails with "Can't redefine method" instead of the real cause.
    ``torch.compiler.reset`` also drops the user's own torch.compile caches: those functions recompile.
    """
    _forget()
    try:
        yield
    finally:
        _forget()


def _forget() -> None:
    torch.compiler.reset()
    for op in torch._ops.get_cached_ops():  # type: ignore[no-untyped-call]
        op._dispatch_cache.clear()
    torch._ops.reset_cached_ops()  # type: ignore[no-untyped-call]
    # A new store makes scripting build new (name-mangled) types. The class registry itself must stay: clearing
    # it frees the methods of live ScriptModules, the user's included, and calling them then crashes.
    torch.jit._recursive.concrete_type_store = torch.jit._recursive.ConcreteTypeStore()
