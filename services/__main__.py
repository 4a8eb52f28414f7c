"""``python -m services`` runs the ``switchyard`` command."""

from services.cli import main

main()
