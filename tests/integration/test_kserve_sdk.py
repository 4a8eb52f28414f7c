"""KServe's own Python SDK (``kserve``: ``InferenceRESTClient`` with protocol v2, ``InferenceGRPCClient``) against the
gateway on the embedded backend: health, readiness and inference with JSON and binary tensors, over REST and gRPC."""

from __future__ import annotations

import pytest

from tests.kserve_sdk_cases import (  # noqa: F401  (fixtures and tests pytest collects from here)
    report,
    request_json,
    test_kserve_sdk_infers_reference_outputs_when_tensors_are_json_or_binary,
    test_kserve_sdk_reads_health_when_gateway_ready,
)

pytestmark = pytest.mark.slow  # a gateway on real ports, and the SDK in a process of its own
