"""A key's own share of the node: its requests in flight at once (``concurrency`` in the keys file), counted from
the moment the dataplane takes the request to its answer, across every model the key calls. One key that floods
the gateway then waits on itself instead of taking every model's concurrency slots from the other tenants.

Per process by default; with ``serve --workers N`` the count is the node's (``NodeShare``), as rate limits are.
Replicas behind a load balancer each hold their own count (a replica's share of the key's traffic)."""

from __future__ import annotations

from collections.abc import Callable

from services.gateway.errors import RateLimited
from services.gateway.shaping.node_share import NodeShare, NodeSlots

Refused = Callable[[str, str], None]
"""Told (key id, reason) of every refusal, for ``switchyard_api_key_rejected_total``."""


class KeyBusy(RateLimited):
    """The key has as many requests in flight as its ``concurrency`` allows: 429, as for its rate, since the
    client can fix it by waiting for its own answers."""

    reason = "key_concurrency"
    retry_after_s = 1


class KeySlots:
    """One key's requests in flight. ``limit`` follows the keys file (a reload may change it; the count carries
    over). Not thread-safe: one event loop uses it."""

    __slots__ = ("key_id", "limit", "inflight", "_node", "_refused")

    def __init__(
        self, key_id: str, limit: int, share: NodeShare | None = None, refused: Refused | None = None
    ) -> None:
        self.key_id = key_id
        self.limit = limit
        self._refused = refused
        self.inflight = 0
        """This process's requests of the key in flight (the node's, summed in the share, with workers)."""
        self._node = NodeSlots(share, key_id, kind="key") if share is not None else None

    def take(self) -> None:
        """A slot for one request, or ``KeyBusy``; every ``take`` that returns is matched by one ``give_back``."""
        node = self._node
        if node is None:
            if self.inflight >= self.limit:
                raise self._busy(self.inflight)
        elif not node.try_take(self.limit):
            raise self._busy(node.executing)
        self.inflight += 1

    def give_back(self) -> None:
        self.inflight -= 1
        if self._node is not None:
            self._node.give_back(self.limit, idle=not self.inflight)

    def _busy(self, inflight: int) -> KeyBusy:
        if self._refused is not None:
            self._refused(self.key_id, KeyBusy.reason)
        return KeyBusy(
            f"API key '{self.key_id}' has {inflight} requests in flight, its limit is {self.limit} (its 'concurrency' "
            "in the keys file); send the next one when an answer arrives"
        )


class KeyQuotas:
    """The ``KeySlots`` of every key that has a ``concurrency``, by id: made on a key's first request, kept while the
    file names the key (bounded by the file's keys)."""

    def __init__(self, share: NodeShare | None = None, *, refused: Refused | None = None) -> None:
        self._share = share
        self._refused = refused
        self._slots: dict[str, KeySlots] = {}

    def slots(self, key_id: str, limit: int) -> KeySlots:
        found = self._slots.get(key_id)
        if found is None:
            found = self._slots[key_id] = KeySlots(key_id, limit, self._share, self._refused)
        elif found.limit != limit:
            found.limit = limit  # the file changed the key's limit: in force from its next request
        return found

    def get(self, key_id: str) -> KeySlots | None:
        return self._slots.get(key_id)
