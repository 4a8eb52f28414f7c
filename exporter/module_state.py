"""What an export must leave as it found it in the caller's module: train/eval flags, buffers and parameters.

The exporter runs ``forward`` many times (eager for the parity gate, traces, ``torch.export``); a forward that
writes its own state (``self.n += 1``, a running average) would otherwise come out of ``export()`` changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def kept_state(module: nn.Module) -> Iterator[None]:
    """Put ``module`` in eval mode for the block (serving is inference: dropout off, batch norm on running stats)
    and give back each submodule's own training flag and each buffer and parameter, the same tensor objects holding
    the same values, after it: a model may be training with a frozen batch norm, and an optimizer holds its
    parameters by identity."""
    modes = [(m, m.training) for m in module.modules()]
    tensors: list[tuple[dict[str, Any], str, torch.Tensor, torch.Tensor]] = [
        (slots, name, tensor, tensor.detach().clone())
        for m in module.modules()
        for slots in (m._buffers, m._parameters)
        for name, tensor in slots.items() if tensor is not None]
    module.eval()
    try:
        yield
    finally:
        for submodule, training in modes:
            submodule.training = training
        with torch.no_grad():
            for slots, name, tensor, value in tensors:
                slots[name] = tensor  # forward may have replaced it (self.n = self.n + 1)
                if tensor.shape == value.shape and tensor.dtype == value.dtype and tensor.device == value.device:
                    tensor.copy_(value)
                else:
                    tensor.data = value
