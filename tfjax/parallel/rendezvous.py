"""The processes of an explicitly described job check in with process 0 before JAX starts.

Why: once `jax.distributed.initialize` runs, JAX's client ends the process natively (status
134, a C++ stack trace) when the job cannot form: a process that never comes (after JAX's
`initialization_timeout`), a coordinator it cannot reach, a second process 0, a port where
something else listens. And JAX's service only knows process 0's process count, so processes
started with different counts run silently as process 0's job. (The client's
`missed_heartbeat_callback`, which could turn the abort into an exception, fails with
`std::bad_cast` in jax 0.10.2, and its key-value store is only reachable once every process
has connected.) So each process first checks in here, over plain TCP on the coordinator's own
port, before any JAX call:

  * process 0 (`serve`) listens on the port, checks that its own coordinator address reaches
    it, and waits up to `wait` seconds for processes 1 .. P-1, each of which sends a hello
    (its id, its process count, host and pid) and gets an acknowledgement at once;
  * a hello with another count, a second process with one id, or another process 0 ends the
    check-in on every process with one line naming both; the wait running out names the
    processes that never came; a peer that disconnects while waiting is dropped (it may come
    back);
  * when every process is there, process 0 closes its listener and tells each to go on; they
    all call `jax.distributed.initialize`, whose service then binds the same port.

A peer (`join`) retries the connection until `wait` runs out; a listener that does not
acknowledge like process 0 within `ACK_SECONDS` is something else. Messages are one JSON
object a line, each carrying `PROTOCOL`.
"""

import dataclasses
import json
import logging
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Sequence

from tfjax import errors

log = logging.getLogger(__name__)

PROTOCOL = "tfjax-join/1"
ACK_SECONDS = 10.0  # a listener that does not acknowledge a hello in this time is not process 0
HELLO_SECONDS = 2.0  # a connection that sends no hello in this time is not a process of the job
_LINE = 4096  # the longest message line read
_HELLO = ("process_id", "num_processes", "host", "pid", "nonce")
_LOOPBACK = ("127.", "localhost", "[::1]")


@dataclasses.dataclass(frozen=True)
class Shape:
    """What one process was told about its job: enough to check in and to name the fix."""

    address: str  # "host:port" of process 0
    count: int
    index: int
    variables: Sequence[str]  # the names of the address, count and id variables, for messages

    def hello(self, nonce: str) -> dict:
        return dict(
            process_id=self.index,
            num_processes=self.count,
            host=socket.gethostname(),
            pid=os.getpid(),
            nonce=nonce,
        )


def split_address(address: str, name: str) -> tuple[str, int]:
    """(host, port) of "host:port" (IPv6 hosts in brackets); raises a DistributedError."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise errors.DistributedError(f"{name}={address!r} is not host:port (e.g. 127.0.0.1:12355)")
    return host.strip("[]"), int(port)


def resolve(shape: Shape) -> tuple[str, int]:
    """(host, port) of the coordinator, once its host name resolves; raises a one-line error."""
    host, port = split_address(shape.address, shape.variables[0])
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise errors.DistributedError(
            f"{shape.variables[0]}={shape.address}: the host {host!r} does not resolve "
            f"({err.strerror}): give process 0's host name or IP address, the same for every "
            "process"
        ) from None
    return host, port


def _send(conn: socket.socket, **fields) -> None:
    conn.sendall((json.dumps({"protocol": PROTOCOL, **fields}) + "\n").encode())


def _message(line: bytes, *keys: str) -> dict | None:
    """The message a line holds, None if it is not one of this protocol (with `keys`)."""
    try:
        message = json.loads(line.decode("utf-8"))
    except ValueError:
        return None
    ok = isinstance(message, dict) and message.get("protocol") == PROTOCOL
    return message if ok and all(key in message for key in keys) else None


def _who(hello: dict) -> str:
    return f"process {hello['process_id']} on {hello['host']} (pid {hello['pid']})"


def _ids(ids: Sequence[int]) -> str:
    return ("process " if len(ids) == 1 else "processes ") + ", ".join(map(str, ids))


def _listen(shape: Shape, host: str, port: int) -> socket.socket:
    """Process 0's listener on the coordinator port (loopback addresses: only there, as JAX
    binds then); raises a one-line error when the port is taken."""
    loopback = shape.address.startswith(_LOOPBACK)
    try:
        if loopback:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            return socket.create_server((host, port), family=family, reuse_port=False)
        dual = socket.has_dualstack_ipv6()
        family = socket.AF_INET6 if dual else socket.AF_INET
        return socket.create_server(("", port), family=family, dualstack_ipv6=dual)
    except OSError as err:
        raise errors.DistributedError(
            f"process 0 cannot serve the coordinator on port {port} "
            f"({os.strerror(err.errno) if err.errno else err}): is "
            "another process 0 running (each process needs its own "
            f"{shape.variables[2]}), or another program on the port? choose a free one in "
            f"{shape.variables[0]}, or let python -m experiments.launch_local pick one"
        ) from None


class _Probe(threading.Thread):
    """Process 0 sends a hello to its own coordinator address: the address must reach it."""

    def __init__(self, shape: Shape, nonce: str):
        super().__init__(daemon=True)
        self.shape, self.nonce = shape, nonce
        self.failure: str | None = None  # why the address did not reach this process
        self.refused: str | None = None  # the error another process 0 answered with

    def run(self) -> None:
        host, port = split_address(self.shape.address, self.shape.variables[0])
        try:
            with socket.create_connection((host, port), timeout=ACK_SECONDS) as conn:
                _send(conn, **self.shape.hello(self.nonce))
                conn.settimeout(3 * ACK_SECONDS)  # this process may be admitting another
                reply = _message(conn.makefile("rb").readline(_LINE))
        except OSError as err:
            reply = None
            self.failure = f"connecting to it failed: {err.strerror or err}"
        if reply is not None and "error" in reply:  # another process 0 answered
            self.refused = reply["error"]
        elif reply is None and self.failure is None:
            self.failure = "another program answered there"


class _Lobby:
    """Process 0's side: the processes that checked in, by id, and their connections."""

    def __init__(self, shape: Shape, wait: float | int):
        self.shape, self.wait = shape, wait
        self.nonce = secrets.token_hex(8)
        self.me = shape.hello(self.nonce)
        self.peers: dict[int, tuple[socket.socket, dict]] = {}
        self.reached = False  # this process's own hello came back through the address
        self.deadline = time.monotonic() + wait

    def missing(self) -> list[int]:
        return [i for i in range(1, self.shape.count) if i not in self.peers]

    def fail(self, message: str, *others: socket.socket) -> errors.DistributedError:
        """Tells every waiting process `message`; returns the error for this one."""
        for conn in [*others, *(conn for conn, _ in self.peers.values())]:
            try:
                _send(conn, error=message)
            except OSError:
                pass
            conn.close()
        self.peers.clear()
        return errors.DistributedError(message)

    def admit(self, conn: socket.socket) -> None:
        """Reads one hello from `conn`; raises the job's error if it cannot be this job's."""
        conn.settimeout(HELLO_SECONDS)
        try:
            hello = _message(conn.makefile("rb").readline(_LINE), *_HELLO)
        except OSError:
            hello = None
        if hello is None:  # a port scanner, or a JAX client started too early: not a peer
            log.warning("ignored a connection to the coordinator that is not a tfjax process")
            conn.close()
            return
        _, count_name, id_name = self.shape.variables
        index, count = hello["process_id"], hello["num_processes"]
        if index in self.peers:  # its earlier self may have died since the loop last looked
            self.drop_departed()
        if index == 0 and hello["nonce"] == self.nonce:
            self.reached = True
            _send(conn, waiting_for=self.missing())
            conn.close()
        elif index == 0 or index in self.peers:
            first = self.me if index == 0 else self.peers[index][1]
            raise self.fail(
                f"two processes have id {index}: {_who(first)} and {_who(hello)}: give "
                f"every process its own {id_name}, 0 to {self.shape.count - 1}",
                conn,
            )
        elif count != self.shape.count:
            raise self.fail(
                f"{_who(hello)} was started with {count_name}={count}, process 0 with "
                f"{count_name}={self.shape.count}: start every process of the job with the "
                "same count",
                conn,
            )
        else:
            self.peers[index] = (conn, hello)
            conn.settimeout(None)
            _send(conn, waiting_for=self.missing(), seconds_left=self.deadline - time.monotonic())

    def drop_departed(self) -> None:
        """Forgets the processes whose connection closed while they waited (they died)."""
        conns = [conn for conn, _ in self.peers.values()]
        readable = select.select(conns, [], [], 0)[0] if conns else []
        for index, (conn, hello) in list(self.peers.items()):
            if conn in readable:
                log.warning("%s left before the job started; waiting for it again", _who(hello))
                conn.close()
                del self.peers[index]

    def release(self) -> None:
        """Tells every process to go on, then waits briefly for each to hang up first (so
        that the closed connections do not hold the port JAX's service binds next)."""
        conns = [conn for conn, _ in self.peers.values()]
        for conn in conns:
            _send(conn, go=True)
        deadline = time.monotonic() + 2
        while conns and time.monotonic() < deadline:
            for conn in select.select(conns, [], [], 0.1)[0]:
                conn.close()
                conns.remove(conn)
        for conn in conns:
            conn.close()
        self.peers.clear()

    def timed_out(self) -> errors.DistributedError:
        missing = self.missing()
        names = self.shape.variables
        ids = (
            f"={missing[0]}"
            if len(missing) == 1
            else " of each (" + ", ".join(map(str, missing)) + ")"
        )
        return self.fail(
            f"{_ids(missing)} of {self.shape.count} did not join process 0 at "
            f"{self.shape.address} within {self.wait:g} s (parallel."
            f"initialization_timeout_seconds): start {'it' if len(missing) == 1 else 'them'} "
            f"with {names[0]}={self.shape.address}, {names[1]}={self.shape.count} and "
            f"{names[2]}{ids}, or raise the timeout"
        )


def serve(shape: Shape, wait: float | int) -> None:
    """Process 0: returns once every process of the job has checked in.

    Raises:
        DistributedError: the port is taken, the address does not reach this process, the
            processes disagree on the job's shape, or some did not come within `wait` s.
    """
    host, port = resolve(shape)
    lobby = _Lobby(shape, wait)
    with _listen(shape, host, port) as listener:
        probe = _Probe(shape, lobby.nonce)
        probe.start()
        missing = lobby.missing()
        log.info("waiting up to %g s for %s to join", wait, _ids(missing) if missing else "none")
        while not (lobby.reached and not lobby.missing()):
            if select.select([listener], [], [], 0.1)[0]:
                lobby.admit(listener.accept()[0])
            lobby.drop_departed()
            late = time.monotonic() > lobby.deadline
            if not lobby.reached and (late or not probe.is_alive()):
                if probe.refused:
                    raise lobby.fail(probe.refused)
                why = probe.failure or f"no answer within {wait:g} s"
                raise lobby.fail(
                    f"process 0 cannot reach its own coordinator address {shape.address} "
                    f"({why}): {shape.variables[0]} must name the machine process 0 runs on, "
                    "and a port nothing else uses"
                )
            if late:
                raise lobby.timed_out()
    lobby.release()


def join(shape: Shape, wait: float | int) -> None:
    """A process other than 0: returns once process 0 says every process has checked in.

    Raises:
        DistributedError: the host does not resolve, process 0 did not answer within `wait`
            s, something else listens on the port, or process 0 ended the check-in.
    """
    host, port = resolve(shape)
    conn = _connect(shape, host, port, wait)
    with conn, conn.makefile("rb") as replies:
        _send(conn, **shape.hello(secrets.token_hex(8)))
        ack = _reply(shape, replies, conn, ACK_SECONDS, first=True)
        if "error" not in ack:
            waiting = _ids(ack["waiting_for"]) if ack["waiting_for"] else "nobody else"
            log.info("checked in with process 0; waiting for %s", waiting)
            ack = _reply(shape, replies, conn, ack.get("seconds_left", wait) + 30, first=False)
    if "error" in ack:
        raise errors.DistributedError(f"the job did not start; process 0 says: {ack['error']}")


def _connect(shape: Shape, host: str, port: int, wait: float | int) -> socket.socket:
    """A connection to process 0's port, retried until `wait` seconds have passed."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return socket.create_connection((host, port), timeout=min(ACK_SECONDS, wait))
        except OSError as err:
            if time.monotonic() > deadline:
                raise errors.DistributedError(
                    f"the coordinator at {shape.address} (process 0) did not answer within "
                    f"{wait:g} s ({err.strerror or err}): start process 0 with the same "
                    f"{shape.variables[0]}, or raise parallel.initialization_timeout_seconds"
                ) from None
            time.sleep(0.2)


def _reply(shape: Shape, replies, conn: socket.socket, timeout: float, *, first: bool) -> dict:
    """Process 0's next message: an acknowledgement (`first`), a go-ahead, or an error."""
    conn.settimeout(timeout)
    try:
        line = replies.readline(_LINE)
    except OSError:  # the timeout, or a reset connection
        line = b""
        if first:
            raise errors.DistributedError(
                f"something at {shape.address} accepted the connection but did not answer as "
                f"process 0 of a tfjax job within {ACK_SECONDS:g} s: is {shape.variables[0]} "
                "the address process 0 was given, and its port free of other programs?"
            ) from None
    message = _message(line)
    if message is not None:
        return message
    if first and not line:
        raise errors.DistributedError(
            f"something at {shape.address} closed the connection without answering as "
            f"process 0 of a tfjax job (a job already running there, or another program): "
            f"give {shape.variables[0]} the address process 0 was given, with a free port"
        )
    if first:
        raise errors.DistributedError(
            f"something else listens at {shape.address}: it answered {line[:40]!r}, not as "
            f"process 0 of a tfjax job (a job already running there, or another program): "
            f"give {shape.variables[0]} the address process 0 was given, with a free port"
        )
    raise errors.DistributedError(
        f"process 0 at {shape.address} hung up before every process had joined: it stopped "
        "(see its output); start it again with the same variables"
    )
