"""Config overrides of a repository load: what is taken (the version policy, a round-tripped config, either
spelling of the runtime) and what is refused, with the field named."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.errors import InvalidInput
from services.gateway.repository_api.overrides import apply_override, describe_policy
from services.tritonlocal import derive_config

DISK = text_format.Parse(
    """
    name: "mlp" platform: "onnxruntime_onnx" max_batch_size: 8
    input { name: "features" data_type: TYPE_FP32 dims: [ 32 ] }
    output { name: "probabilities" data_type: TYPE_FP32 dims: [ 8 ] }
    version_policy { all { } }
    dynamic_batching { max_queue_delay_microseconds: 100 }
    """,
    mc.ModelConfig(),
)


def test_override_takes_the_version_policy_alone_when_it_sets_only_that() -> None:
    taken = apply_override("mlp", json.dumps({"version_policy": {"specific": {"versions": [2]}}}), DISK, None)
    assert describe_policy(taken) == "specific [2]"
    assert taken.dynamic_batching.max_queue_delay_microseconds == 100  # the rest is config.pbtxt's


def test_override_means_tritons_default_policy_when_it_sets_none() -> None:
    assert describe_policy(apply_override("mlp", json.dumps({"max_batch_size": 8}), DISK, None)) == "latest 1"


def test_override_is_taken_when_it_is_the_served_config_with_a_new_policy() -> None:
    for served in (DISK, derive_config(DISK)):  # the embedded backend's, and the local Triton's python twin
        fetched = json_format.MessageToDict(served, preserving_proto_field_name=True)
        fetched["version_policy"] = {"latest": {"num_versions": 2}}
        assert describe_policy(apply_override("mlp", json.dumps(fetched), DISK, served)) == "latest 2"
    spelled = apply_override("mlp", json.dumps({"backend": "onnxruntime"}), DISK, None)
    assert spelled.platform == "onnxruntime_onnx"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("[]", "not a ModelConfig in JSON"),
        ('{"version_policy": {"specific": {"versions": ["two"]}}}', "not a ModelConfig in JSON"),
        ('{"name": "other"}', "names model 'other' but the request loads 'mlp'"),
        ('{"platform": "pytorch_libtorch"}', "runs the model on 'pytorch_libtorch' but it is a 'onnxruntime_onnx'"),
        ('{"output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [8]}]}',
         "config.pbtxt has ['probabilities']"),
        ('{"instance_group": [{"count": 4}], "max_batch_size": 2}', "it sets instance_group, max_batch_size to other"),
    ],
)
def test_override_is_refused_naming_what_differs_when_it_changes_more_than_the_policy(
    override: str, named: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        apply_override("mlp", override, DISK, None)
    assert named in str(refused.value)
