"""An analysis aid of the gateway benchmark, not a gateway to run: ``pvisor gateway`` whose
journal writer records nothing (every finished exchange is dropped before the writer, thread
or process, sees it), so that ``bench/cpu_per_request.py --pvisor loop-only=...`` measures what the event
loop alone costs. It bounds what moving the writer out of the process could gain: a writer of
zero cost leaves this. Started as ``python bench/loop_only_gateway.py [pvisor gateway options]``.
"""

from __future__ import annotations

import sys

from pvisor.journal.producer import JournalProducer


def _drop(self, end) -> None:
    self._inflight.pop(end.pending.id, None)  # as end_exchange does; nothing is queued


JournalProducer.end_exchange = _drop  # type: ignore[method-assign]

if __name__ == "__main__":
    from pvisor.cli import main

    main(sys.argv[1:])
