"""Which version answers: the version manager and its swap protocol, the routing record, leases and draining,
canary and shadow traffic, replicas following the state store, loading and warm-up, and the version-string parser.
See ``docs/architecture.md`` ("Versions")."""
