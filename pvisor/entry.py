"""The ``pvisor`` command's entry point (``[project.scripts]``, ``python -m pvisor``, a bundle's
executable): :func:`pvisor.cli.main` with the cyclic garbage collector off while the command
line and the command's own modules are imported.

Importing click, orjson and a command's modules creates some 10^5 objects that live as long as
the process and no cyclic garbage: the collector would only rescan them, with a full collection of
all of them now and then. That was about a tenth of a short command's start (``trajectory show``
of a small file: 224 million instructions with the collector on, 200 million with it off; the
stack floor ``python -c 'import click, orjson'``, which keeps it on, 180 million; docs/
benchmarks.md "Replay prepare-only: fidelity and startup"). Once the command is loaded,
:meth:`pvisor.cli.LazyGroup.get_command` freezes what the imports made (:func:`gc.freeze`: left
out of every later collection) and turns the collector back on, so that a long command (a
gateway, a run) does not rescan them either; a fast-exit command (``replay --prepare-only``)
keeps it off until it ends. A command line that loads no command (``--help``, ``--version``, a
usage error) ends with it off.
"""

import gc


def main() -> None:
    """Run the ``pvisor`` command (sys.argv); exits with its exit code."""
    gc.disable()  # pvisor.cli turns it back on, or leaves it off for a fast-exit command
    from pvisor.cli import main as cli_main

    cli_main()
