"""``config.pbtxt``: read and written through Triton's ``ModelConfig`` protobuf and ``text_format``."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from services.modelrepo.layout import CONFIG_FILE


class ConfigError(Exception):
    """A ``config.pbtxt`` that cannot be read or parsed; the message names the file and the cause."""


def read_config(model_dir: Path) -> mc.ModelConfig:
    """The model's config; an empty ``name`` is filled with the folder's name, as Triton does, and another name
    is refused, as Triton does."""
    path = model_dir / CONFIG_FILE
    config = mc.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except (OSError, UnicodeDecodeError, text_format.ParseError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not config.name:
        config.name = model_dir.name
    elif config.name != model_dir.name:
        raise ConfigError(f"{path} names model '{config.name}' but lies in {model_dir.name}/; the names must match")
    return config


def to_text(config: mc.ModelConfig) -> str:
    """config.pbtxt's text, ``max_batch_size: 0`` written out: protobuf leaves a zero out of the text (Triton reads
    no field as 0 too), but a reader of the file should see that the model has no batch dim."""
    text = text_format.MessageToString(config)
    if config.max_batch_size != 0:
        return text
    lines = text.splitlines(keepends=True)
    after = next((i + 1 for i, line in enumerate(lines) if line.startswith(("platform:", "backend:"))), 0)
    return "".join([*lines[:after], "max_batch_size: 0\n", *lines[after:]])


def select_versions(config: mc.ModelConfig, available: Collection[int]) -> tuple[int, ...]:
    """The versions the config's ``version_policy`` serves out of ``available``, ascending."""
    ordered = tuple(sorted(available))
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return ordered
    if which == "specific":
        wanted = {int(v) for v in policy.specific.versions}
        return tuple(v for v in ordered if v in wanted)
    # Triton's default policy is latest { num_versions: 1 }.
    count = policy.latest.num_versions if which == "latest" and policy.latest.num_versions > 0 else 1
    return ordered[-count:]


def pinned(config: mc.ModelConfig, versions: Collection[int]) -> mc.ModelConfig:
    """A copy of ``config`` whose version policy lists exactly ``versions``."""
    message = mc.ModelConfig()
    message.CopyFrom(config)
    message.version_policy.specific.versions[:] = sorted(set(versions))
    return message


def override_json(config: mc.ModelConfig, versions: Collection[int] | None = None) -> str:
    """``config`` as the JSON a repository load override takes, pinned to ``versions`` when given.

    Triton replaces ``config.pbtxt`` with the override instead of merging: it must be complete.
    """
    message = pinned(config, versions) if versions is not None else config
    return json_format.MessageToJson(message, preserving_proto_field_name=True)
