"""What every floor of pvisor shares and is not the store (docs/layout.md).

- :mod:`.errors`: the error tree (one docstring draws it) and the exit codes.
- :mod:`.record`: ``Record``, the small typed record with a hand-written ``__init__``.
- :mod:`.lazyre`: regular expressions compiled on first use.
- :mod:`.progress`: progress lines on stderr.
- :mod:`.helpers`: the helper processes the entry point runs (the writer, the guard), by name.
- :mod:`.artifact`: a build's identity and manifest.
- :mod:`.digest`: SHA-256 of bytes and files.
- :mod:`.outfile`: output files written whole or not at all.

Imports nothing of pvisor's: the lowest floor.
"""
