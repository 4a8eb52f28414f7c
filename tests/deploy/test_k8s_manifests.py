"""deploy/k8s: every manifest validates against the Kubernetes OpenAPI schemas (``kubernetes-validate``, strict,
offline) for the oldest and newest Kubernetes it ships, kustomization.yaml lists exactly the manifests to apply,
probes use the v2 health routes, and the admin Secret is only a template left out of the kustomization."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions

from services.gateway.workers.supervisor import STARTUP_TIMEOUT_S
from tests.deploy.deploy_tools import K8S, load_documents, load_yaml

KUSTOMIZATION = K8S / "kustomization.yaml"
SECRET_TEMPLATE = K8S / "gateway-secret.template.yaml"
NOT_MANIFESTS = {KUSTOMIZATION.name, "prometheus-adapter-rules.yaml"}
"""YAML files under deploy/k8s that are no Kubernetes objects (kustomize's own file, the adapter's Helm values)."""
VERSIONS = ("1.27.0", all_versions()[-1])
EXPECTED_KINDS = {"Namespace", "PersistentVolumeClaim", "Deployment", "Service", "ConfigMap",
                  "HorizontalPodAutoscaler", "PodDisruptionBudget", "Job"}


def manifests() -> list[Path]:
    return sorted(path for path in K8S.glob("*.yaml") if path.name not in NOT_MANIFESTS)


def objects(paths: list[Path]) -> list[dict[str, Any]]:
    return [document for path in paths for document in load_documents(path)]


def applied() -> list[dict[str, Any]]:
    return objects([K8S / name for name in load_yaml(KUSTOMIZATION)["resources"]])


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def named(kind: str, name: str) -> dict[str, Any]:
    return next(item for item in applied() if item["kind"] == kind and item["metadata"]["name"] == name)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", manifests(), ids=lambda path: path.name)
def test_k8s_manifest_validates_when_checked_against_the_schema(path: Path, version: str) -> None:
    documents = load_documents(path)
    assert documents
    for document in documents:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{path.name}: {document['kind']}/{document['metadata']['name']}: "
                        f"{'.'.join(map(str, error.path))}: {error.message}")


def test_k8s_kustomization_lists_every_manifest_but_the_secret_template_when_parsed() -> None:
    listed = load_yaml(KUSTOMIZATION)["resources"]
    assert len(listed) == len(set(listed))
    assert set(listed) == {path.name for path in manifests()} - {SECRET_TEMPLATE.name}
    assert {item["kind"] for item in applied()} == EXPECTED_KINDS
    assert load_yaml(KUSTOMIZATION)["namespace"] == named("Namespace", "switchyard")["metadata"]["name"]


def test_k8s_secret_is_only_a_template_when_committed() -> None:
    (secret,) = load_documents(SECRET_TEMPLATE)
    assert secret["kind"] == "Secret"
    assert "data" not in secret
    assert set(secret["stringData"].values()) == {"REPLACE-WITH-A-RANDOM-TOKEN"}
    assert "kubectl -n switchyard create secret generic switchyard-admin" in SECRET_TEMPLATE.read_text()
    assert not [item for item in applied() if item["kind"] == "Secret"]
    gateway = pod_spec(named("Deployment", "gateway"))["containers"][0]
    assert {"secretRef": {"name": secret["metadata"]["name"]}} in gateway["envFrom"]


def test_k8s_probes_use_the_v2_health_routes_when_parsed() -> None:
    for workload in ("gateway", "triton"):
        (container,) = pod_spec(named("Deployment", workload))["containers"]
        if workload == "gateway":  # the gRPC health service on the gRPC port: the same readiness, the other listener
            grpc_port = next(port["containerPort"] for port in container["ports"] if port["name"] == "grpc")
            assert container["readinessProbe"]["grpc"] == {"port": grpc_port}
        else:
            assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready", workload
        assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live", workload
        # A liveness probe on readiness would restart a gateway whose Triton is down (README "Serving").
        assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live", workload


def test_k8s_gateway_startup_probe_outlasts_the_gateways_own_startup_bound_when_parsed() -> None:
    # The listeners open only after the models are loaded and warmed (until then the probe's connection is refused),
    # and the gateway itself waits up to STARTUP_TIMEOUT_S for that: a shorter window restarts a pod that is loading.
    (container,) = pod_spec(named("Deployment", "gateway"))["containers"]
    probe = container["startupProbe"]
    window_s = probe["periodSeconds"] * probe["failureThreshold"]
    assert window_s >= STARTUP_TIMEOUT_S, (
        f"the startup probe gives up after {window_s} s; the gateway may take {STARTUP_TIMEOUT_S:g} s to start")


def test_k8s_gateway_is_configured_for_triton_and_redis_when_parsed() -> None:
    config = named("ConfigMap", "gateway-config")["data"]
    assert config["SWITCHYARD_BACKEND"] == "triton"
    assert config["SWITCHYARD_TRITON_URL"] == "triton:8001"
    assert config["SWITCHYARD_TRITON_HTTP_URL"] == "triton:8000"
    assert config["SWITCHYARD_REDIS_URL"] == "redis://redis:6379/0"
    assert "SWITCHYARD_ADMIN_TOKEN" not in config
    services = {item["metadata"]["name"]: item for item in applied() if item["kind"] == "Service"}
    assert {name: service["spec"]["type"] for name, service in services.items()} == {
        "gateway": "ClusterIP", "triton": "ClusterIP", "redis": "ClusterIP", "otel-collector": "ClusterIP"}
    assert {port["port"] for port in services["triton"]["spec"]["ports"]} == {8000, 8001, 8002}


def test_k8s_triton_requests_a_gpu_and_pods_are_scraped_when_parsed() -> None:
    (triton,) = pod_spec(named("Deployment", "triton"))["containers"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--model-control-mode=explicit" in triton["args"]
    for workload, port in (("gateway", "8000"), ("triton", "8002")):
        annotations = named("Deployment", workload)["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": port,
                               "prometheus.io/path": "/metrics"}


def test_k8s_autoscaler_uses_cpu_and_inflight_requests_when_parsed() -> None:
    hpa = named("HorizontalPodAutoscaler", "gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway"}
    metrics = {metric["type"]: metric for metric in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    assert metrics["Pods"]["pods"]["metric"]["name"] == "switchyard_inflight_requests"
    rules = load_yaml(K8S / "prometheus-adapter-rules.yaml")["rules"]["custom"]
    assert [rule["name"]["as"] for rule in rules] == ["switchyard_inflight_requests"]
    pdb = named("PodDisruptionBudget", "gateway")
    gateway = named("Deployment", "gateway")
    assert pdb["spec"]["selector"]["matchLabels"] == gateway["spec"]["selector"]["matchLabels"]


def test_k8s_exporter_job_writes_into_the_repository_claim_when_parsed() -> None:
    job = named("Job", "exporter")
    (container,) = pod_spec(job)["containers"]
    assert container["image"].startswith("switchyard-exporter:")
    volumes = {volume["name"]: volume for volume in pod_spec(job)["volumes"]}
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/models"
    assert not mount.get("readOnly")
    assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == "model-repository"
    named("PersistentVolumeClaim", "model-repository")
