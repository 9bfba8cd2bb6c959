"""Run a benchmark target on uvloop's event loop: ``python bench/uvloop_run.py SCRIPT [ARGS]``
runs SCRIPT (``bench/bare_proxy.py``) and ``python bench/uvloop_run.py -m pvisor ARGS`` the pvisor
command, each with ``uvloop.EventLoopPolicy`` set first, so that ``asyncio.run`` makes a uvloop
loop. Used by ``bench/cpu_per_request.py --uvloop`` (uvloop installed in the bench venv)."""

from __future__ import annotations

import asyncio
import runpy
import sys

import uvloop

asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
if sys.argv[1] == "-m":
    sys.argv = [sys.argv[2], *sys.argv[3:]]
    from pvisor.cli import main

    main(sys.argv[1:])
else:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
