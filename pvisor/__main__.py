"""``python -m pvisor`` runs the CLI."""

from pvisor.cli import main

main()
