"""Locust scenarios against a Switchyard gateway (or any KServe v2 server): HTTP inference in JSON and binary, gRPC
inference, an ops user switching versions through the admin API, and SLO gates that set the exit code.

    locust -f loadtests/locustfile.py --headless -u 8 -r 4 -t 60s --host http://127.0.0.1:8000 \\
        --model mlp --slo-error-ratio 0.001 --slo-p99-ms infer-json=50,grpc-infer=50

Own options (each also an environment variable, see load_options.py; locust's --help does not list them because it
does not load the locustfile): --model, --rows, --shape, --grpc-target, --api-key, --think-ms, --admin-token,
--ops-interval, --ops-version, --slo-error-ratio, --slo-p99-ms.

Stats entries: ``infer-json``, ``infer-binary``, ``metadata``, ``config`` (HTTP), ``grpc-infer``, ``grpc-metadata``,
``grpc-config`` (type grpc), ``admin-status``, ``activate``, ``rollback`` (ops). The admin token comes from
``--admin-token`` or ``SWITCHYARD_ADMIN_TOKEN``; without it the ops user stays idle. Without ``--grpc-target`` the
gRPC users connect to --host's name at the port the gateway advertises in ``GET /v2`` (else at its port + 1; see
grpc_target.py), and the start-up log says which rule found it. Needs only locust, numpy and tritonclient[grpc]:
this folder is imported on its own (locust puts it on ``sys.path``), as the compose service does.
"""

from __future__ import annotations

from functools import partial

from grpc_user import GrpcUser
from http_user import InferenceUser
from load_options import add_arguments, check_options
from locust import events
from ops_user import OpsUser
from slo_gates import enforce

__all__ = ["GrpcUser", "InferenceUser", "OpsUser"]

CALLS_BEFORE = {
    "infer-json": ("metadata", "config"),
    "infer-binary": ("metadata", "config"),
    "grpc-infer": ("grpc-metadata", "grpc-config"),
}
"""What each user reads before it infers: when those calls fail, a gate on the inference entry names why."""

# locust's EventHook.add_listener is unannotated.
events.init_command_line_parser.add_listener(add_arguments)  # type: ignore[no-untyped-call]
events.init.add_listener(check_options)  # type: ignore[no-untyped-call]
events.quitting.add_listener(partial(enforce, calls_before=CALLS_BEFORE))  # type: ignore[no-untyped-call]
