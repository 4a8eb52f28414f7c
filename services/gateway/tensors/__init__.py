"""Protocol-neutral tensors: request and response types, datatypes, BYTES, shared-memory regions, and validation
of a request against its model's metadata. See ``docs/architecture.md`` ("Tensors")."""
