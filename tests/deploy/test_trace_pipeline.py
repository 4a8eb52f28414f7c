"""The trace path of the deployment: the gateway and Triton send OTLP to the OpenTelemetry Collector, whose pipeline
(deploy/otel-collector.yaml) forwards to Tempo (deploy/tempo.yaml); Grafana reads Tempo and links Prometheus'
exemplars to it. The same wiring in compose and in deploy/k8s, read from the files as they are committed."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from services.tritonlocal import TritonTracing
from tests.deploy.deploy_tools import COMPOSE, DEPLOY, GRAFANA, K8S, load_documents, load_yaml

COLLECTOR_CONFIG = DEPLOY / "otel-collector.yaml"
TEMPO_CONFIG = DEPLOY / "tempo.yaml"
DATASOURCES = GRAFANA / "provisioning" / "datasources"
GATEWAY_TRACING = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4318",
    "OTEL_SERVICE_NAME": "switchyard-gateway",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "0.05",
}
TRITON_TRACING = TritonTracing(url="http://otel-collector:4318/v1/traces", rate=0).flags()
"""What ``switchyard triton`` would pass for the gateway's endpoint, with rate 0: Triton traces what the gateway
hands it a traceparent for."""


def component_names(section: dict[str, Any]) -> set[str]:
    return set(section or {})


@pytest.fixture(scope="module")
def collector() -> dict[str, Any]:
    config: dict[str, Any] = load_yaml(COLLECTOR_CONFIG)
    return config


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    raw: dict[str, Any] = load_yaml(COMPOSE)["services"]
    return raw


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    for path in sorted(K8S.glob("*.yaml")):
        for document in load_documents(path):
            if document.get("kind") == kind and document.get("metadata", {}).get("name") == name:
                return document
    raise AssertionError(f"no {kind}/{name} in {K8S}")


def test_collector_pipeline_wires_defined_receivers_processors_and_exporters(collector: dict[str, Any]) -> None:
    pipelines = collector["service"]["pipelines"]
    assert set(pipelines) == {"traces"}
    traces = pipelines["traces"]
    for kind in ("receivers", "processors", "exporters"):
        assert traces[kind], f"the traces pipeline has no {kind}"
        assert set(traces[kind]) <= component_names(collector[kind]), f"{kind} used but not defined: {traces[kind]}"
        assert component_names(collector[kind]) <= set(traces[kind]), f"{kind} defined but unused"
    assert traces["processors"] == ["batch"]
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert {name: protocol["endpoint"] for name, protocol in protocols.items()} == {
        "grpc": "0.0.0.0:4317", "http": "0.0.0.0:4318"}
    assert set(collector["service"]["extensions"]) == component_names(collector["extensions"])


def test_compose_collector_exports_to_tempo_which_receives_otlp_grpc(
    collector: dict[str, Any], services: dict[str, Any]
) -> None:
    (exporter,) = collector["exporters"].values()
    assert exporter["endpoint"] == "${env:TRACE_STORE_ENDPOINT}"
    assert services["otel-collector"]["environment"]["TRACE_STORE_ENDPOINT"] == "tempo:4317"
    assert "./deploy/otel-collector.yaml:/etc/otelcol-contrib/config.yaml:ro" in services["otel-collector"]["volumes"]
    tempo = load_yaml(TEMPO_CONFIG)
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert "./deploy/tempo.yaml:/etc/tempo.yaml:ro" in services["tempo"]["volumes"]
    assert services["tempo"]["command"] == ["-config.file=/etc/tempo.yaml"]
    assert {"3200", "4317"} <= set(services["tempo"]["expose"])
    assert {"4317", "4318"} <= set(services["otel-collector"]["expose"])
    assert services["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert services["tempo"]["image"].startswith("grafana/tempo:")


def test_compose_gateway_and_triton_send_their_traces_to_the_collector(services: dict[str, Any]) -> None:
    environment = services["gateway"]["environment"]
    assert {key: environment[key] for key in GATEWAY_TRACING} == GATEWAY_TRACING
    command = services["triton"]["command"]
    start = command.index("--trace-config")
    assert sorted(zip(command[start::2], command[start + 1::2], strict=True)) == sorted(
        zip(TRITON_TRACING[::2], TRITON_TRACING[1::2], strict=True))


def test_compose_prometheus_keeps_exemplars_and_grafana_links_them_to_tempo(services: dict[str, Any]) -> None:
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    sources = {source["uid"]: source for path in DATASOURCES.glob("*.yml") for source in load_yaml(path)["datasources"]}
    assert sources["tempo"]["type"] == "tempo"
    assert sources["tempo"]["url"] == "http://tempo:3200"
    links = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert links == [{"name": "trace_id", "datasourceUid": "tempo"}]


def test_k8s_collector_runs_the_compose_config_and_the_gateway_and_triton_point_at_it() -> None:
    config_map = k8s_object("ConfigMap", "otel-collector")
    assert yaml.safe_load(config_map["data"]["config.yaml"]) == load_yaml(COLLECTOR_CONFIG)
    deployment = k8s_object("Deployment", "otel-collector")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert [variable["name"] for variable in container["env"]] == ["TRACE_STORE_ENDPOINT"]
    assert {port["containerPort"] for port in container["ports"]} >= {4317, 4318}
    service = k8s_object("Service", "otel-collector")
    assert {port["port"] for port in service["spec"]["ports"]} == {4317, 4318}
    gateway_config = k8s_object("ConfigMap", "gateway-config")["data"]
    assert {key: gateway_config[key] for key in GATEWAY_TRACING} == GATEWAY_TRACING
    (triton,) = k8s_object("Deployment", "triton")["spec"]["template"]["spec"]["containers"]
    start = triton["args"].index("--trace-config")
    assert triton["args"][start:start + len(TRITON_TRACING)] == TRITON_TRACING
