"""The client side of operations: ``switchyard models``, ``switchyard traffic`` and ``switchyard tune`` and their
HTTP client of the admin API. Nothing here imports the gateway's server code: the commands start fast and run
on a machine that only talks to a gateway."""
