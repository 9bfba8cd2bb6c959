"""``python -m pvisor`` runs the CLI; so does a build's ``pvisor`` executable (scripts/build-bundle,
whose entry point this is), which also runs pvisor's helper processes (core/helpers.py)."""

import sys

if getattr(sys, "frozen", False):
    from pvisor.core.helpers import HELPER_FLAG, run_frozen_helper

    if sys.argv[1:2] == [HELPER_FLAG]:
        run_frozen_helper(sys.argv[1:])

from pvisor.entry import main

main()
