"""The configs Triton is asked to load: how the repository's are mapped for a given server, and the ones worth a
warning."""

from __future__ import annotations

import logging
from collections.abc import Callable

from tritonclient.grpc import model_config_pb2

log = logging.getLogger(__name__)

ConfigTransform = Callable[[model_config_pb2.ModelConfig], model_config_pb2.ModelConfig]


def identity(config: model_config_pb2.ModelConfig) -> model_config_pb2.ModelConfig:
    """A production Triton loads the repository's configs as they are."""
    return config


def warn_if_single_instance(config: model_config_pb2.ModelConfig) -> None:
    """Triton 2.51's dynamic batcher can hold a request ~500 ms when the model's only instance is busy as it
    arrives (its idle wait misses the wake-up); the exporter writes two instances for that reason."""
    instances = sum(group.count or 1 for group in config.instance_group) if config.instance_group else 1
    if config.HasField("dynamic_batching") and instances == 1:
        log.warning(
            "model '%s' has one instance with dynamic batching: Triton can then hold requests ~500 ms; "
            "re-export it with --instances 2 (or set instance_group.count: 2 in its config.pbtxt)",
            config.name,
        )
