"""The admin API under ``/admin`` (HTTP port only): version status, activate / rollback / load / unload, the audit
log and repository scans, behind a bearer token."""

from services.gateway.admin.endpoints import AdminEndpoints
from services.gateway.admin.routes import add_admin_routes
from services.gateway.shaping.admin_auth import AdminAuth

__all__ = ["AdminAuth", "AdminEndpoints", "add_admin_routes"]
