"""pvisor: capture coding-agent model exchanges into an Event Journal, and replay them step-exactly.

The installed packages are ``pvisor.journal`` (canonical model and SQLite store),
``pvisor.adapters`` (wire protocols, native formats, agent launch profiles),
``pvisor.gateway`` (the capture proxy), ``pvisor.replay`` and this package (CLI).
Importing ``pvisor`` imports nothing else.
"""

from pvisor._version import __version__

__all__ = ["__version__"]
