"""The mitmproxy addon of intercept mode: a script that ``mitmdump -s`` loads (pvisor starts it).

It runs inside mitmdump's own interpreter, which may not have pvisor installed (a separate
venv, pipx, or mitmproxy's standalone binaries): it imports only mitmproxy and the standard
library. pvisor passes it its settings as JSON in the environment variable
``PVISOR_INTERCEPT``::

    {"gateway": ["127.0.0.1", PORT],   # the pvisor gateway that answers and records
     "token": "...",                    # proves to the gateway that the request came from here
     "hosts": {"api.anthropic.com:443": "https://api.anthropic.com", ...},  # host:port -> origin
     "ready_fd": N,                     # a pipe: one JSON line once the proxy listens
     "ca_only": false}                  # true: create the CA in confdir, then exit

What it does (mitmproxy's ``allow_hosts`` option, set by pvisor, keeps every other host a raw
TCP tunnel that this addon never sees decrypted):

- a request to an intercepted host goes, unchanged (method, path, query, headers, body, its
  ``Host`` header too), to the gateway over plain HTTP on the loopback address, with one
  header added: ``X-Pvisor-Intercept: <token> <origin>``. The gateway strips it, records the
  exchange with ``capture = intercept`` and answers through its responder seam (forwarding to
  the origin, or to its ``--redirect`` address, or serving the scripted model or playback);
- its response streams back unbuffered (``flow.response.stream``), chunk by chunk as the
  gateway writes it.

The one line written to ``ready_fd``: ``{"listen": [HOST, PORT]}`` (or ``{"ca": true}`` with
``ca_only``). Source of the hooks: mitmproxy 11's event hooks (``running``, ``request``,
``responseheaders``) and its ``proxyserver`` addon's ``listen_addrs()``.
"""

from __future__ import annotations

import json
import os

from mitmproxy import ctx, http

INTERCEPT_HEADER = "X-Pvisor-Intercept"


class PvisorIntercept:
    def __init__(self) -> None:
        settings = json.loads(os.environ.get("PVISOR_INTERCEPT", "{}"))
        self.gateway_host, self.gateway_port = settings.get("gateway") or ("127.0.0.1", 0)
        self.token = settings.get("token", "")
        self.hosts: dict[str, str] = settings.get("hosts", {})
        self.ready_fd: int | None = settings.get("ready_fd")
        self.ca_only = bool(settings.get("ca_only"))

    def _ready(self, doc: dict) -> None:
        if self.ready_fd is None:
            return
        fd, self.ready_fd = self.ready_fd, None
        try:
            os.write(fd, (json.dumps(doc) + "\n").encode())
        finally:
            os.close(fd)

    def running(self) -> None:
        if self.ca_only:  # the CA is in confdir once the options are configured
            self._ready({"ca": True})
            ctx.master.shutdown()
            return
        addrs = ctx.master.addons.get("proxyserver").listen_addrs()
        host, port = addrs[0][0], addrs[0][1]
        self._ready({"listen": [host, port]})

    def request(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        req.headers.pop(INTERCEPT_HEADER, None)  # never the client's own
        origin = self.hosts.get(f"{req.host.lower()}:{req.port}")
        if origin is None:
            return  # a plain-HTTP request to another host: proxied as it is, never recorded
        # the destination only (data.*): the Host header stays what the agent sent
        req.data.host = self.gateway_host
        req.data.port = self.gateway_port
        req.data.scheme = b"http"
        req.headers[INTERCEPT_HEADER] = f"{self.token} {origin}"
        flow.metadata["pvisor"] = origin

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if "pvisor" in flow.metadata and flow.response is not None:
            # each chunk to the agent as it comes; a whole JSON body too: relaying it as it comes
            # costs mitmdump less than buffering it (bench/intercept_latency.py)
            flow.response.stream = True


addons = [PvisorIntercept()]
