"""The relay: the process pvisor starts inside an agent's sandbox (:mod:`pvisor.session.sandbox`),
the agent's supervisor there. Standard library only, run as ``python -I -S -c <this file>
CONFIG_FD`` (in a bundle: the ``relay`` helper of :mod:`pvisor.core.helpers`), so that it starts in
milliseconds.

CONFIG_FD is a descriptor the relay inherits, of an unlinked file holding its configuration
as JSON (written by :meth:`~pvisor.session.sandbox.Sandbox.config_file`): nothing of it lies in
a directory the agent can write, so no recorded call can read or rewrite it. ``argv`` the
agent's command line; ``listen`` a list of ``[host, port, unix_socket]``: a TCP listener inside
on ``host``:``port`` whose connections go to ``unix_socket`` (the gateway, mitmdump, outside);
``ready_fd`` the status pipe: the relay says on it that it started (one JSON line: ``{"pid":
N}``, or ``{"error": "..."}``), and at its end how the agent ended (a second line, below);
``grace`` seconds the agent's process group gets after SIGTERM, ``stray_grace`` those left
after it; ``skip_tmp`` paths in /tmp not to list; ``tmp_listed`` how many /tmp entries to list
at most.

What it does: makes itself undumpable (``PR_SET_DUMPABLE`` 0: a process of the agent, the same
user without a capability, can then neither open ``/proc/RELAY/fd/N`` to write the status pipe
nor ptrace the relay; it can still signal it), binds its listeners, starts the agent (its own
session and process group, the stop signals at their default, stdin, stdout, stderr and the
working directory its own, the status pipe closed in it), and waits. On SIGTERM, SIGINT or
SIGHUP it stops the agent's process group as pvisor does (SIGTERM, SIGKILL after ``grace`` s or
at once on a second signal); once the agent exited, it ends every other process left in the PID
namespace (SIGTERM, SIGKILL after ``stray_grace`` s), lists /tmp, and writes its status line
on the status pipe: ``{"returncode": R, "strays": N, "tmp": [...], "stopped": bool}`` (R as
Python's ``returncode``: -N after signal N). Its own exit code is the agent's as a shell
reports it. Outside a PID namespace of its own under bwrap (a relay started by hand) it ends no
process but the agent's group.
"""

import json
import os
import select
import signal
import socket
import sys
import threading
import time

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: what the agent gets at their default whatever the relay does with them
DEFAULT_SIGNALS = (*STOP_SIGNALS, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGQUIT)


def _pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _connection(conn, path):
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        up.close()
        conn.close()
        return
    back = threading.Thread(target=_pump, args=(up, conn), daemon=True)
    back.start()
    _pump(conn, up)
    back.join()
    conn.close()
    up.close()


def _accept(listener, path):
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_connection, args=(conn, path), daemon=True).start()


def _listen(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def own_pid_namespace():
    """Whether this relay runs as pvisor starts it: in a PID namespace of its own, the child of
    that namespace's init, bwrap. Only then is every other process in /proc the agent's: outside
    one, ending "every other process" would end every process of the machine."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            init = f.read().split(b"\0", 1)[0]
    except OSError:
        return False
    return os.getppid() == 1 and b"bwrap" in os.path.basename(init)


def _others():
    """The live processes of the PID namespace other than its init (1) and this relay."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (1, me):
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def _tmp_entries(skip, limit):
    """What was written into the private /tmp: its entries, not those of the mounts in it
    (``skip``) nor the directories bwrap made to hold them."""
    holders = set()
    for path in skip:
        while path not in ("/", "/tmp", ""):
            path = os.path.dirname(path)
            holders.add(path)
    out = []
    for root, dirs, files in os.walk("/tmp"):
        dirs[:] = sorted(d for d in dirs if os.path.join(root, d) not in skip)
        for name in sorted([*dirs, *files]):
            path = os.path.join(root, name)
            if path in skip or path in holders:
                continue
            out.append(path + ("/" if name in dirs else ""))
            if len(out) >= limit:
                return out
    return out


class _Relay:
    def __init__(self, cfg):
        self.cfg = cfg
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (*STOP_SIGNALS, signal.SIGCHLD):
            signal.signal(sig, lambda *_: None)  # the byte on the wakeup pipe says which
        self.stopping = False
        self.hurry = False

    def signals(self, timeout):
        """The stop signals that came within ``timeout`` s (None: until one comes)."""
        try:
            ready, _, _ = select.select([self.wake_r], [], [], timeout)
        except InterruptedError:
            return []
        if not ready:
            return []
        data = os.read(self.wake_r, 256)
        return [s for s in data if s in [int(x) for x in STOP_SIGNALS]]

    def on_signals(self, sigs, pgid):
        for _ in sigs:
            if self.stopping:
                self.hurry = True
                _killpg(pgid, signal.SIGKILL)
            else:
                self.stopping = True
                _killpg(pgid, signal.SIGTERM)

    def wait_agent(self, pid):
        """The agent's status, stopping its group on a stop signal."""
        kill_at = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                if self.stopping:
                    _killpg(pid, signal.SIGKILL)  # members that ignored SIGTERM
                return os.waitstatus_to_exitcode(status)
            now = time.monotonic()
            if self.stopping and kill_at is None:
                kill_at = now + self.cfg["grace"]
            if kill_at is not None and now >= kill_at:
                _killpg(pid, signal.SIGKILL)
                kill_at = now + 3600
            timeout = None if kill_at is None else max(0.0, kill_at - now)
            if timeout is None:
                timeout = 1.0  # SIGCHLD may have come before the first wait
            self.on_signals(self.signals(timeout), pid)

    def end_strays(self):
        """End every other process of the namespace; how many there were (0 outside a PID
        namespace of its own, where it ends nothing: :func:`own_pid_namespace`)."""
        if not own_pid_namespace():
            return 0
        ended = set()
        deadline = time.monotonic() + self.cfg["stray_grace"]
        give_up = deadline + 5.0
        while True:
            live = _others()
            now = time.monotonic()
            if not live or now >= give_up:
                return len(ended)
            sig = signal.SIGKILL if now >= deadline or self.hurry else signal.SIGTERM
            for pid in live:
                if pid not in ended or sig == signal.SIGKILL:
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        continue
                    ended.add(pid)
            if self.signals(0.05):
                self.hurry = True


def _killpg(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def _say(fd, doc, close=True):
    if fd < 0:
        return
    try:
        data = (json.dumps(doc) + "\n").encode()
        while data:
            data = data[os.write(fd, data) :]
        if close:
            os.close(fd)
    except OSError:
        pass


def _undumpable():
    """``prctl(PR_SET_DUMPABLE, 0)`` (best effort: ctypes may be missing)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (ImportError, OSError, AttributeError):
        pass


def main(argv):
    _undumpable()
    with os.fdopen(int(argv[0]), "rb") as f:  # closed here: the agent does not inherit it
        cfg = json.loads(f.read().decode("utf-8"))
    ready = int(cfg.get("ready_fd", -1))
    if ready >= 0:
        os.set_inheritable(ready, False)  # close-on-exec: the agent does not inherit it
    relay = _Relay(cfg)
    try:
        for host, port, path in cfg["listen"]:
            listener = _listen(host, int(port))
            threading.Thread(target=_accept, args=(listener, path), daemon=True).start()
    except OSError as exc:
        _say(ready, {"error": f"the relay cannot listen on {host}:{port} in the sandbox: {exc.strerror}"})
        sys.exit(70)
    args = cfg["argv"]
    try:
        pid = os.posix_spawnp(args[0], args, dict(os.environ), setsid=True, setsigdef=DEFAULT_SIGNALS)
    except OSError as exc:
        _say(ready, {"error": f"cannot start {args[0]} in the sandbox: {exc.strerror}"})
        sys.exit(70)
    _say(ready, {"pid": pid}, close=False)
    returncode = relay.wait_agent(pid)
    strays = relay.end_strays()
    status = {
        "returncode": returncode,
        "strays": strays,
        "tmp": _tmp_entries(set(cfg.get("skip_tmp") or ()), int(cfg.get("tmp_listed", 100))),
        "stopped": relay.stopping,
    }
    _say(ready, status)
    sys.stdout.flush()
    os._exit(128 - returncode if returncode < 0 else returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
