"""Replay: rebuild the request prefix that ends at the observation of step N, and (later) hand
that boundary to a live agent through the gateway (DESIGN.md "Replay").

Modules:

- :mod:`.prepare`: ``--prepare-only``: :func:`~.prepare.prepare_only` writes prefix.json,
  prefix.request.json and result.json (schema ``sandbox-playback.result/v3``,
  docs/result-protocol.md); executes nothing, starts nothing, opens no socket.
- :mod:`.prefix`: the prefix from a journal run (recorded bytes of request N+1) or from a native
  trajectory (rendered by the protocol module, with parts from a ``--profile-from`` capture).
- :mod:`.workspace`: the workspace digest.
- :mod:`.errors`: errors with result-protocol codes.

Nothing is imported here, so that ``import pvisor.replay`` costs nothing.
"""
