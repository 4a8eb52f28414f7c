"""The ``config`` parameter of a repository load: a JSON ``ModelConfig`` that, in Triton, replaces ``config.pbtxt``
for that load. Here it may change the version policy only; everything else it sets must be what the model already
has, so that a config fetched with ``get_model_config`` and given a new policy loads as it would in Triton."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.errors import InvalidInput
from services.gateway.shaping.json_limits import bounded_json
from services.modelrepo import layout

HONOURED = "version_policy"
_CHECKED_APART = {"name", HONOURED, "platform", "backend", "input", "output"}


def apply_override(model: str, text: str, disk: mc.ModelConfig, served: mc.ModelConfig | None) -> mc.ModelConfig:
    """The config to load: ``disk`` (the model's ``config.pbtxt``) with the override's version policy, or with
    Triton's default one (latest 1) when it sets none, since an override replaces the whole file. ``served`` is the
    configuration the gateway answers for the model now, whose values are accepted too. Raises ``InvalidInput``
    naming what is wrong; nothing has changed then."""
    override = parse(text)
    if override.name and override.name != model:
        raise InvalidInput(f"the config override names model '{override.name}' but the request loads '{model}'")
    known = [config for config in (disk, served) if config is not None]
    _check_runtime(override, known)
    for kind in ("input", "output"):
        _check_tensors(kind, override, disk)
    differing = _differing(override, known)
    if differing:
        names = ", ".join(differing)
        raise InvalidInput(
            f"a config override may change only {HONOURED} here; it sets {names} to other values than the model's "
            f"config.pbtxt has (the gateway loads every other setting from config.pbtxt: change them there and load "
            "again)"
        )
    effective = mc.ModelConfig()
    effective.CopyFrom(disk)
    effective.ClearField(HONOURED)
    if override.HasField(HONOURED):
        effective.version_policy.CopyFrom(override.version_policy)
    return effective


def parse(text: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        fields = bounded_json(text)  # depth-limited before ParseDict, which recurses once per level
        if not isinstance(fields, dict):
            raise json_format.ParseError(f"expected a JSON object, got {type(fields).__name__}")
        json_format.ParseDict(fields, config)
    except (ValueError, json_format.ParseError) as exc:  # orjson's JSONDecodeError is a ValueError
        raise InvalidInput(f"the 'config' parameter is not a ModelConfig in JSON: {exc}") from None
    return config


def describe_policy(config: mc.ModelConfig) -> str:
    """``specific [2]``, ``all``, ``latest 1`` (Triton's default when the config sets none)."""
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "specific":
        return f"specific {sorted(int(v) for v in policy.specific.versions)}"
    if which == "all":
        return "all"
    return f"latest {policy.latest.num_versions or 1}"


def _check_runtime(override: mc.ModelConfig, known: list[mc.ModelConfig]) -> None:
    """``platform`` and ``backend`` name the runtime two ways (``onnxruntime_onnx`` is the ``onnxruntime`` backend);
    either spelling of the model's own runtime is accepted."""
    if not (override.platform or override.backend):
        return
    wanted = layout.platform(override)
    runtimes = {layout.platform(config) for config in known}
    if wanted not in runtimes:
        raise InvalidInput(
            f"the config override runs the model on '{wanted}' but it is a '{layout.platform(known[0])}' model; "
            "a load cannot change a model's platform or backend"
        )


def _check_tensors(kind: str, override: mc.ModelConfig, disk: mc.ModelConfig) -> None:
    """An override that lists inputs (outputs) lists the model's own, unchanged; one that lists none keeps them, as
    Triton's auto-complete would fill them in."""
    given = {t.name: t for t in getattr(override, kind)}
    if not given:
        return
    expected = {t.name: t for t in getattr(disk, kind)}
    if set(given) != set(expected):
        raise InvalidInput(
            f"the config override must keep the model's {kind}s: config.pbtxt has {sorted(expected)}, "
            f"the override has {sorted(given)}"
        )
    for name, tensor in given.items():
        if _as_dict(tensor) != _as_dict(expected[name]):
            raise InvalidInput(
                f"the config override must keep {kind} '{name}' as config.pbtxt has it ({_text(expected[name])}), "
                f"got {_text(tensor)}"
            )


def _differing(override: mc.ModelConfig, known: list[mc.ModelConfig]) -> list[str]:
    mine = _as_dict(override)
    theirs = [_as_dict(config) for config in known]
    return sorted(
        field.name
        for field, _ in override.ListFields()
        if field.name not in _CHECKED_APART and all(mine.get(field.name) != other.get(field.name) for other in theirs)
    )


def _text(message: Any) -> str:
    return str(text_format.MessageToString(message, as_one_line=True))


def _as_dict(message: Any) -> dict[str, Any]:
    found: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return found
