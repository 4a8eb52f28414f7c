"""Turn a user's module and example inputs into a flat, positional, tuple-returning module.

Triton serves named tensors in a fixed order, so every export goes through ``FlatModule``:
positional tensors in, a tuple of tensors out, nested list/dict outputs flattened to named
outputs in the order the model returned them. The pitfalls that can be seen before export
(QAT modules, mixed devices, ``forward(**kwargs)``, a forward that raises, a batch axis the
model drops) are caught here with an error naming the cause and the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from exporter.dtypes import triton_name
from exporter.errors import DynamicBatchError, InvalidSpecError, ModelError
from exporter.specs import validate_tensor_name

ExampleInputs = torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]


class FlatModule(nn.Module):
    """Calls the wrapped module positionally or by keyword and returns its tensors as a flat tuple."""

    def __init__(self, inner: nn.Module, keyword_names: tuple[str, ...] | None) -> None:
        super().__init__()
        self.inner = inner
        self.keyword_names = keyword_names

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.keyword_names is None:
            out = self.inner(*args)
        else:
            out = self.inner(**dict(zip(self.keyword_names, args, strict=True)))
        leaves, _ = pytree.tree_flatten(out)
        return tuple(leaves)


@dataclass
class PreparedModel:
    """The flat module with everything learned from running it once on the example inputs."""

    flat: FlatModule
    input_names: tuple[str, ...]
    examples: tuple[torch.Tensor, ...]
    output_names: tuple[str, ...]
    reference_outputs: tuple[torch.Tensor, ...]
    notes: list[str] = field(default_factory=list)
    batched: bool = True
    """Whether axis 0 of every tensor is the batch (``max_batch_size`` over 0); otherwise tensors are served whole."""

    @property
    def batch_size(self) -> int:
        return int(self.examples[0].shape[0])

    def served_shape(self, tensor: torch.Tensor) -> tuple[int, ...]:
        """The shape config.pbtxt declares for a tensor like ``tensor``: without its batch axis when batched."""
        return tuple(int(d) for d in (tensor.shape[1:] if self.batched else tensor.shape))

    @property
    def input_datatypes(self) -> tuple[str, ...]:
        return tuple(triton_name(t.dtype) for t in self.examples)

    @property
    def output_datatypes(self) -> tuple[str, ...]:
        return tuple(triton_name(t.dtype) for t in self.reference_outputs)


def prepare(
    module: nn.Module,
    example_inputs: ExampleInputs,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    *,
    batched: bool = True,
) -> PreparedModel:
    """``batched``: axis 0 of every example input and output is the batch (checked here); without, the examples
    are whole requests, of any rank."""
    if not isinstance(module, nn.Module):
        raise ModelError(f"expected a torch.nn.Module, got {type(module).__name__}")
    _refuse_fake_quant(module)
    notes: list[str] = []
    keys = tuple(str(k) for k in example_inputs) if isinstance(example_inputs, Mapping) else None
    params = _forward_parameters(module)
    names, examples = _normalise_examples(example_inputs, input_names, _positional_names(params), notes, batched)
    _refuse_mixed_devices(module, examples)
    keyword_names = keys
    if params is not None:
        keyword_names = _binding(params, names, keys) if input_names is not None else keys
        _check_signature(params, keyword_names or names, keyword_names is not None)
    flat = FlatModule(module, keyword_names)
    ran_on = tuple(t.clone() for t in examples)  # compared with the examples afterwards
    outputs, tree = _run_eager(flat, module, ran_on)
    _refuse_input_changes(names, examples, ran_on)
    out_names = _output_names(tree, len(outputs), output_names)
    if batched:
        _check_batch_axes(names, examples, out_names, outputs)
    else:
        _refuse_scalars(names, examples, out_names, outputs)
    return PreparedModel(flat, names, examples, out_names, outputs, notes, batched)


def _normalise_examples(
    example_inputs: ExampleInputs,
    input_names: Sequence[str] | None,
    positional: Sequence[str],
    notes: list[str],
    batched: bool,
) -> tuple[tuple[str, ...], tuple[torch.Tensor, ...]]:
    if isinstance(example_inputs, torch.Tensor):
        pairs: list[tuple[str | None, Any]] = [(None, example_inputs)]
    elif isinstance(example_inputs, Mapping):
        pairs = [(str(k), v) for k, v in example_inputs.items()]
    elif isinstance(example_inputs, Sequence) and not isinstance(example_inputs, str):
        pairs = [(None, v) for v in example_inputs]
    else:
        raise InvalidSpecError(
            f"example_inputs must be a tensor, a tuple of tensors or a dict name->tensor, "
            f"got {type(example_inputs).__name__}"
        )
    if not pairs:
        raise InvalidSpecError("example_inputs is empty: give at least one tensor with the batch dim first")
    if input_names is not None:
        if len(input_names) != len(pairs):
            raise InvalidSpecError(
                f"input_names has {len(input_names)} names but there are {len(pairs)} example inputs"
            )
        pairs = [(n, t) for n, (_, t) in zip(input_names, pairs, strict=True)]
    names = tuple(n if n is not None else _default_input_name(i, positional) for i, (n, _) in enumerate(pairs))
    for n in names:
        validate_tensor_name(n)
    if len(set(names)) != len(names):
        raise InvalidSpecError(f"input names must be unique, got {list(names)}")
    tensors: list[torch.Tensor] = []
    for name, value in zip(names, (t for _, t in pairs), strict=True):
        if not isinstance(value, torch.Tensor):
            raise InvalidSpecError(f"example input {name!r} is a {type(value).__name__}, expected a torch.Tensor")
        if value.dim() == 0 and batched:  # without a batch dim, _refuse_scalars explains why not either
            raise InvalidSpecError(
                f"example input {name!r} is a scalar; every input needs the batch dim first, e.g. shape (1, ...), "
                "or export with max_batch_size=0 for a model without a batch dim"
            )
        triton_name(value.dtype)
        if not value.is_contiguous():
            # Triton hands the model row-major buffers, so export what it will really receive.
            notes.append(f"example input {name!r} was not contiguous; exported with a contiguous copy")
        # A copy of the caller's tensor: the export runs the model on it, which must never change the caller's data.
        tensors.append(value.detach().clone(memory_format=torch.contiguous_format))
    batches = {int(t.shape[0]) for t in tensors} if batched else {0}
    if len(batches) != 1:
        sizes = {n: int(t.shape[0]) for n, t in zip(names, tensors, strict=True)}
        raise InvalidSpecError(f"example inputs disagree on the batch size (dim 0): {sizes}")
    empty = [f"{n} {list(t.shape)}" for n, t in zip(names, tensors, strict=True) if t.numel() == 0]
    if empty:
        # An empty example shows the model nothing: no values to draw the parity gate's inputs like, no row to trace.
        raise InvalidSpecError(
            f"example inputs {', '.join(empty)} hold no values (a dim of size 0): give "
            f"{'at least one row, and every other dim' if batched else 'every dim'} at least 1, with values like "
            "those the model will serve"
        )
    return names, tuple(tensors)


def _refuse_fake_quant(module: nn.Module) -> None:
    from torch.ao.quantization import FakeQuantizeBase, ObserverBase

    found = [n or "<root>" for n, m in module.named_modules() if isinstance(m, FakeQuantizeBase | ObserverBase)]
    if found:
        shown = ", ".join(found[:5]) + (" ..." if len(found) > 5 else "")
        raise ModelError(
            f"the model still contains quantization-aware-training modules ({shown}). Their observers and "
            "fake-quant ops are training machinery, not a servable graph. Convert the model first "
            "(torch.ao.quantization.convert(model.eval()) for int8 kernels, or remove the QConfig for an "
            "fp32 export); to serve Q/DQ deliberately, quantize with the pt2e flow and export that graph."
        )


def _refuse_mixed_devices(module: nn.Module, examples: tuple[torch.Tensor, ...]) -> None:
    where: dict[str, list[str]] = {}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        where.setdefault(str(tensor.device), []).append(name)
    for i, tensor in enumerate(examples):
        where.setdefault(str(tensor.device), []).append(f"<example input {i}>")
    if len(where) > 1:
        listing = "; ".join(f"{dev}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                            for dev, names in where.items())
        raise ModelError(
            f"the model and its inputs live on more than one device ({listing}). An exported graph runs on "
            "one device: move everything first, e.g. model.to('cpu') and the example inputs with .to('cpu')."
        )


def _forward_parameters(module: nn.Module) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # builtins and some compiled modules have no signature
        return None


def _positional_names(params: list[inspect.Parameter] | None) -> list[str]:
    return [p.name for p in params or () if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _default_input_name(index: int, positional: Sequence[str]) -> str:
    """forward's own parameter name, so that ``dynamic_axes`` and clients use the names the model's author
    knows; ``input__<i>`` past the named parameters (``*args``) and for non-ASCII names (not servable)."""
    if index < len(positional) and positional[index].isascii():
        return positional[index]
    return f"input__{index}"


def _binding(
    params: list[inspect.Parameter], names: tuple[str, ...], keys: tuple[str, ...] | None
) -> tuple[str, ...] | None:
    """The parameters given ``input_names`` reach, as keyword names (``None``: by position). A served name that is
    one of forward's parameter names must reach that parameter, or a client sending ``b`` would feed ``a``: names
    that are all forward's parameters are bound by name, whatever their order; names that are not parameter names
    (``*args``, a rename) stay positional; a mix that would send a parameter's name to another parameter is
    refused."""
    named = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    by_keyword = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    targets = keys if keys is not None else tuple(_positional_names(params))
    misplaced = [(n, targets[i] if i < len(targets) else f"input {i} of *args")
                 for i, n in enumerate(names) if n in named and (i >= len(targets) or targets[i] != n)]
    if not misplaced:
        return keys
    if keys is None and all(n in by_keyword for n in names):
        return names
    shown = ", ".join(f"{n!r} would reach {t if t.startswith('input ') else repr(t)}" for n, t in misplaced)
    signature = ", ".join(p.name for p in params)
    raise InvalidSpecError(
        f"input_names {list(names)} name parameters of forward({signature}) other than the ones their tensors "
        f"reach ({shown}), so a client sending one of those names would feed another parameter. Give every input "
        "a name of forward's parameters (they are then bound by name, in any order), or names that are not "
        "forward's parameter names (bound by position)"
        + (", or use the example dict's keys" if keys is not None else "") + "."
    )


def _check_signature(params: list[inspect.Parameter], names: tuple[str, ...], keyword: bool) -> None:
    positional = _positional_names(params)
    var_positional = any(p.kind == p.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
    if not keyword and not positional and not var_positional and var_keyword:
        raise ModelError(
            "forward(**kwargs) takes only keyword arguments, but the example inputs are positional. "
            "Pass example_inputs as a dict name->tensor (e.g. {'input_ids': ids}); each key becomes a "
            "served input of that name."
        )
    keyword_only = [p for p in params if p.kind == p.KEYWORD_ONLY]
    unreached = len(names) > len(positional) and not var_positional
    if not keyword and keyword_only and (unreached or any(p.default is p.empty for p in keyword_only)):
        listed = ", ".join(repr(p.name) for p in keyword_only)
        example = ", ".join(f"{n!r}: ..." for n in [*positional[:len(names)], *(p.name for p in keyword_only)])
        raise InvalidSpecError(
            f"forward({_signature_text(params)}) takes {listed} by keyword only, but the example "
            f"inputs are positional (a tuple of {len(names)}), which cannot reach a keyword-only parameter. Pass "
            f"example_inputs as a dict keyed by parameter name, e.g. {{{example}}}; each key becomes a served input "
            "of that name."
        )
    if keyword and not var_keyword:
        accepted = {p.name for p in params if p.kind != p.POSITIONAL_ONLY}
        unknown = [n for n in names if n not in accepted]
        if unknown:
            raise InvalidSpecError(
                f"example inputs {unknown} are not parameters of forward({', '.join(p.name for p in params)}); "
                "dict keys must match forward's argument names"
            )


def _signature_text(params: list[inspect.Parameter]) -> str:
    """forward's parameters as its ``def`` writes them (``x, *, y``), without annotations."""
    return str(inspect.Signature([p.replace(annotation=p.empty, default=p.empty) for p in params])).strip("()")


def _run_eager(
    flat: FlatModule, module: nn.Module, examples: tuple[torch.Tensor, ...]
) -> tuple[tuple[torch.Tensor, ...], Any]:
    try:
        with torch.no_grad():
            raw = flat.inner(**dict(zip(flat.keyword_names, examples, strict=True))) if flat.keyword_names \
                else flat.inner(*examples)
    except Exception as exc:
        shapes = ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in examples)
        raise ModelError(
            f"the model's forward raised {type(exc).__name__}: {exc} — on the example inputs [{shapes}]. "
            "Fix the model or give example inputs it accepts (batch dim first)."
        ) from exc
    leaves, tree = pytree.tree_flatten(raw)
    if not leaves:
        raise ModelError(
            "the model's forward returned no tensors; it must return a tensor, or a tuple/list/dict of them"
        )
    for path, leaf in _leaf_paths(raw):
        if not isinstance(leaf, torch.Tensor):
            raise ModelError(
                f"the model's output {path or '<root>'} is a {type(leaf).__name__}; only tensors can be served. "
                "Return tensors (convert numbers with torch.as_tensor and keep the batch dim first)."
            )
    return tuple(t.detach() for t in leaves), raw


def _refuse_input_changes(
    names: tuple[str, ...], examples: tuple[torch.Tensor, ...], ran_on: tuple[torch.Tensor, ...]
) -> None:
    """Refuse a forward that changed the copies of the examples it ran on: an exported graph cannot change the
    tensors it is given, and every answer the parity gate compares against would come from changed inputs."""
    changed = [n for n, before, after in zip(names, examples, ran_on, strict=True) if not _same(before, after)]
    if changed:
        raise ModelError(
            f"the model's forward changes its input{'s' if len(changed) > 1 else ''} {', '.join(map(repr, changed))} "
            "in place (an in-place operation such as x.mul_(2), x += 1, x[...] = 0 or x.clamp_(...) on the input). "
            "An exported model cannot change the tensors it is given, so it would not behave as the eager model "
            "does. Compute on a new tensor instead (x = x * 2), or copy the input first (x = x.clone())."
        )


def _same(before: torch.Tensor, after: torch.Tensor) -> bool:
    if before.is_floating_point() or before.is_complex():
        return bool(torch.equal(before, after) or torch.allclose(before, after, rtol=0, atol=0, equal_nan=True))
    return bool(torch.equal(before, after))


def _leaf_paths(raw: Any) -> list[tuple[str, Any]]:
    flat, _ = pytree.tree_flatten_with_path(raw)
    return [("__".join(_key_text(k) for k in path), leaf) for path, leaf in flat]


def _key_text(key: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _output_names(raw: Any, count: int, given: Sequence[str] | None) -> tuple[str, ...]:
    if given is not None:
        if len(given) != count:
            raise InvalidSpecError(f"output_names has {len(given)} names but the model returns {count} tensors")
        names = tuple(given)
    elif isinstance(raw, torch.Tensor):
        names = ("output",)
    else:
        paths = [p for p, _ in _leaf_paths(raw)]
        names = tuple(p if isinstance(raw, Mapping) else f"output__{p}" for p in paths)
    for n in names:
        validate_tensor_name(n)
    if len(set(names)) != len(names):
        raise InvalidSpecError(f"output names must be unique, got {list(names)}")
    return names


def _refuse_scalars(
    input_names: tuple[str, ...],
    examples: tuple[torch.Tensor, ...],
    output_names: tuple[str, ...],
    outputs: tuple[torch.Tensor, ...],
) -> None:
    """A model without a batch dim serves its tensors whole, and Triton refuses a scalar one there ("cannot have
    empty reshape for non-batching model as scalar tensors are not supported"): with a batch dim a scalar per row is
    declared ``dims: [1]`` with ``reshape { shape: [] }``, without one no config can declare it."""
    scalars = [f"input {n!r}" for n, t in zip(input_names, examples, strict=True) if t.dim() == 0]
    scalars += [f"output {n!r}" for n, t in zip(output_names, outputs, strict=True) if t.dim() == 0]
    if scalars:
        raise ModelError(
            f"{', '.join(scalars)} {'is a scalar' if len(scalars) == 1 else 'are scalars'} (shape ()), and Triton "
            "serves no scalar tensor in a model without a batch dim (max_batch_size=0): its config cannot declare "
            "one. Give it shape (1,) instead: an example input torch.tensor([v]) read as t[0] or t.reshape(()) in "
            "forward(), an output returned as y.reshape(1)."
        )


def _check_batch_axes(
    input_names: tuple[str, ...],
    examples: tuple[torch.Tensor, ...],
    output_names: tuple[str, ...],
    outputs: tuple[torch.Tensor, ...],
) -> None:
    batch = int(examples[0].shape[0])
    for name, out in zip(output_names, outputs, strict=True):
        if out.dim() == 0 or int(out.shape[0]) != batch:
            raise DynamicBatchError(
                f"output {name!r} has shape {tuple(out.shape)} for a batch of {batch}: its first axis is not "
                "the batch axis. Every output must keep the batch dim first (avoid reducing over dim 0, "
                "view(-1)/flatten() over the batch, or returning parameters); reshape with x.shape[0]. A model "
                "without a batch dim (a set of items, one fixed-shape request) exports with max_batch_size=0."
            )
