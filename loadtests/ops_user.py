"""The ops user: one per run, it switches the model's version through the admin API while the others send load —
activate a version, then roll back, then activate again, every ``--ops-interval`` seconds. Each action is its own
stats entry (``activate``, ``rollback``), and one whose report does not show the expected stable version fails."""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import quote

from load_options import LoadOptions
from locust import FastHttpUser, task

log = logging.getLogger(__name__)
IDLE_S = 3600.0


class OpsUser(FastHttpUser):
    fixed_count = 1
    # A swap drains in-flight requests (30 s by default) before it answers.
    network_timeout = 120.0
    connection_timeout = 10.0

    options: LoadOptions
    home: int | None = None
    """The stable version when the run began: rollback returns to it."""
    target = 0
    switched = False

    def wait_time(self) -> float:
        return self.options.ops_interval_s if self.home is not None else IDLE_S

    def on_start(self) -> None:
        self.options = LoadOptions.of(self.environment)
        self.path = f"/admin/models/{quote(self.options.model, safe='')}"
        self.headers = {"Authorization": f"Bearer {self.options.admin_token}"}
        if self.options.ops_interval_s <= 0:
            return
        if not self.options.admin_token:
            log.warning("the ops user switches no version: it needs --admin-token (or SWITCHYARD_ADMIN_TOKEN)")
            return
        status = self._post_or_get("GET", "admin-status", self.path)
        if status is None:
            return
        routing = status.get("routing") or {}
        home = routing.get("stable")
        ready = sorted(v["version"] for v in status.get("loaded", []) if v.get("state") == "READY")
        target = self.options.ops_version or max((v for v in ready if v != home), default=0)
        if not isinstance(home, int) or not target or target == home:
            log.warning("the ops user switches no version: stable %s, ready %s, --ops-version %s", home, ready, target)
            return
        self.home, self.target = home, target
        log.info("the ops user switches model %s between %d and %d", self.options.model, home, target)
        # The first switch comes one interval into the run, under load. (locust's User.wait is unannotated.)
        self.wait()  # type: ignore[no-untyped-call]

    @task
    def switch(self) -> None:
        if self.home is None:
            return
        if not self.switched:
            report = self._post_or_get("POST", "activate", f"{self.path}/versions/{self.target}/activate", self.target)
        else:
            report = self._post_or_get("POST", "rollback", f"{self.path}/rollback", self.home)
        if report is not None:
            self.switched = not self.switched

    def _post_or_get(self, method: str, name: str, path: str, stable: int | None = None) -> dict[str, Any] | None:
        """The admin call's JSON answer; ``None`` when it failed (in the stats), or when ``stable`` is given and the
        answer's routing does not name it as the stable version."""
        with self.client.request(method, path, headers=self.headers, name=name, catch_response=True) as response:
            if response.status_code != 200:
                text = (response.content or b"")[:300].decode(errors="replace")
                response.failure(f"HTTP {response.status_code}: {text}")
                return None
            try:
                answer = json.loads(response.content or b"")
                routing = answer.get("routing") or {}
            except (ValueError, AttributeError) as exc:
                response.failure(f"not a JSON object: {exc}")
                return None
            if stable is not None and routing.get("stable") != stable:
                response.failure(f"{name} answered with stable version {routing.get('stable')}, expected {stable}")
                return None
            response.success()
            return dict(answer)
