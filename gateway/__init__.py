"""The capture gateway: an asyncio (aiohttp) server between an agent and its model API that
answers every request through the responder seam and records the exchange in the journal.

The path of one request, one way: route, read, respond, relay, record.

- :mod:`.proxy`: :class:`~.proxy.Gateway`, the server and the relay of one exchange (its end
  as one :class:`~pvisor.journal.exchange_end.ExchangeEnd`).
- :mod:`.routing`: which run, upstream and protocol a request belongs to; :mod:`.access`: who
  may use a gateway that listens beyond this machine; :mod:`.connections`: the bound on open
  connections and the header deadline.
- :mod:`.responder`: the seam (``respond() -> Forward | Serve | Refuse``);
  :mod:`.forwarder`: the answer of a model API; :mod:`.scripted_responder`: the scripted model
  in process (:mod:`.scripted_model` the model, :mod:`.scripted_server` ``pvisor serve-model``).
- :mod:`.recorder`: the one place where exchanges go into the journal; :mod:`.finalize`: the
  reassembly of streamed responses the journal's writer runs; :mod:`.snapshots`: workspace
  checkpoints at candidate main-loop requests; :mod:`.log_file`: ``--log-file``.
- :mod:`.intercept` and :mod:`.intercept_addon`: intercept mode (mitmdump in front, redirecting
  into this gateway); :mod:`.lifecycle`: what the gateway and the scripted server share about
  running and stopping; :mod:`.parent_death`: children that die with pvisor.

Depends on :mod:`pvisor.adapters` and :mod:`pvisor.journal`; nothing above it (docs/gateway.md).
"""
