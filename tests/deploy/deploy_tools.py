"""Shared by the deployment-file tests: the repository's deploy paths, YAML loading, and the external validators
(Debian's ``docker-compose`` and ``promtool``), which skip when missing except under ``CI``, where they fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.import_probe import ROOT
from tests.system_tools import require_tool as require_tool  # the deploy tests take it from here with the paths

COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_GPU = ROOT / "docker-compose.gpu.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
PROMETHEUS_ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS_ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yml"
"""The alert rules prometheus.yml loads, and their ``promtool test rules`` unit tests."""
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "switchyard.json"
ENV_EXAMPLES = {
    DEPLOY / "gateway.env.example": "deploy/gateway.env",
    DEPLOY / "grafana.env.example": "deploy/grafana.env",
}
"""Committed examples of the env files compose reads, and where compose expects the real (git-ignored) ones."""




def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty document of a multi-document YAML file."""
    return [document for document in yaml.safe_load_all(path.read_text()) if document]
