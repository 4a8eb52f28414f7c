"""Route table of the admin API; every admin error answers ``{"error": ...}`` with its status."""

from __future__ import annotations

from fastapi import FastAPI

from services.gateway.admin.endpoints import AdminEndpoints
from services.gateway.rest.route_table import add_route_table


def add_admin_routes(app: FastAPI, endpoints: AdminEndpoints) -> None:
    add_route_table(app, [
        ("/admin/whoami", endpoints.whoami, "GET"),
        ("/admin/models", endpoints.models, "GET"),
        ("/admin/models/{model_name}", endpoints.model, "GET"),
        ("/admin/models/{model_name}/events", endpoints.events, "GET"),
        ("/admin/events", endpoints.all_events, "GET"),
        ("/admin/models/{model_name}/rollback", endpoints.rollback, "POST"),
        ("/admin/models/{model_name}/traffic", endpoints.traffic, "PUT"),
        ("/admin/models/{model_name}/shadow", endpoints.shadow, "PUT"),
        ("/admin/models/{model_name}/inference-log", endpoints.inference_log, "PUT"),
        ("/admin/models/{model_name}/versions/{model_version}/activate", endpoints.activate, "POST"),
        ("/admin/models/{model_name}/versions/{model_version}/load", endpoints.load, "POST"),
        ("/admin/models/{model_name}/versions/{model_version}/unload", endpoints.unload, "POST"),
        ("/admin/repository/scan", endpoints.scan, "POST"),
        ("/admin/models/{model_name}/tune", endpoints.tune_start, "POST"),
        ("/admin/models/{model_name}/tune", endpoints.tune_status, "GET"),
        ("/admin/models/{model_name}/tune", endpoints.tune_cancel, "DELETE"),
    ])
