"""The values of the resource limits (``--sandbox-memory SIZE``, ``--sandbox-cpus N``; their
``replay.toml`` keys): :func:`size_bytes` and :func:`cpu_share` read them, raising ValueError
with what was expected (the callers name the option or the file's key:
:func:`pvisor.session.limits.parse_size`, :mod:`pvisor.replay.config`). Plain values; the
cgroup that applies them is :mod:`pvisor.session.limits`."""

from __future__ import annotations

import math
import re

#: the smallest quota the kernel takes (1 ms per 100 ms period): at least 0.01 CPU
MIN_CPUS = 0.01
#: the smallest memory limit accepted: below it no agent starts, and the error would be obscure
MIN_MEMORY = 4 * 1024 * 1024

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def size_bytes(text: str) -> int:
    """Bytes of a size written ``2G``, ``512M``, ``1.5g``, ``64MiB``, ``300k`` or ``1048576``
    (powers of 1024; a bare number is bytes). ValueError (what was expected) for anything else,
    or for less than :data:`MIN_MEMORY`."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError("expected a size such as 512M, 2G or a number of bytes (K, M, G, T: powers of 1024)")
    size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if size < MIN_MEMORY:
        raise ValueError("at least 4M is needed for an agent to start")
    return size


def cpu_share(text: str) -> float:
    """The number of CPUs written ``0.5`` or ``2``: the share of one CPU's time per period the
    agent's processes may use together. ValueError (what was expected) for anything but a finite
    number of at least :data:`MIN_CPUS`."""
    try:
        cpus = float(text)
    except ValueError:
        cpus = math.nan
    if not (cpus >= MIN_CPUS) or math.isinf(cpus):
        raise ValueError(f"expected a number of CPUs of at least {MIN_CPUS:g}, such as 0.5 or 2")
    return cpus
