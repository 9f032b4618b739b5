"""The check-in of an explicit job's processes with process 0 (`tfjax.parallel.rendezvous`).

Each process is a thread here (the check-in is plain TCP on 127.0.0.1, before any JAX call);
tests/test_multihost.py repeats the cases with real `experiments.train` processes.
"""

import json
import socket
import threading
import time

import portpicker
import pytest

from tfjax import errors
from tfjax.parallel import distributed, rendezvous

NAMES = distributed.ENV_VARS


def _address() -> str:
    return f"127.0.0.1:{portpicker.pick_unused_port()}"


def _run(*processes, wait: float = 5) -> dict[int, str]:
    """Runs `(address, count, index)` processes at once; each one's "ok" or its error text."""
    ends: dict[int, str] = {}

    def check_in(address, count, index):
        shape = rendezvous.Shape(address, count, index, NAMES)
        try:
            (rendezvous.serve if index == 0 else rendezvous.join)(shape, wait)
            ends[index] = "ok"
        except errors.DistributedError as err:
            ends[index] = str(err)

    threads = [threading.Thread(target=check_in, args=process) for process in processes]
    for thread in threads:
        thread.start()
        time.sleep(0.02)  # process 0 first, usually
    for thread in threads:
        thread.join(timeout=60)
    assert all("\n" not in end for end in ends.values()), ends
    return ends


def test_a_job_whose_processes_all_come_goes_on_and_frees_the_port():
    address = _address()
    assert _run((address, 3, 2), (address, 3, 0), (address, 3, 1)) == {0: "ok", 1: "ok", 2: "ok"}
    with socket.socket() as sock:  # where JAX's service binds next
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", int(address.rpartition(":")[2])))


def test_processes_told_different_counts_all_stop_naming_both():
    address = _address()
    ends = _run((address, 2, 0), (address, 3, 1))
    assert (
        ends[0].startswith("process 1 on ")
        and (
            "was started with TFJAX_NUM_PROCESSES=3, process 0 with TFJAX_NUM_PROCESSES=2: "
            "start every process of the job with the same count"
        )
        in ends[0]
    )
    assert ends[1] == f"the job did not start; process 0 says: {ends[0]}"


def test_a_process_that_never_comes_is_named_after_the_stated_wait():
    address = _address()
    started = time.monotonic()
    ends = _run((address, 3, 0), (address, 3, 1), wait=1)
    assert time.monotonic() - started < 4
    assert ends[0] == (
        f"process 2 of 3 did not join process 0 at {address} within 1 s (parallel."
        f"initialization_timeout_seconds): start it with TFJAX_COORDINATOR_ADDRESS={address}, "
        "TFJAX_NUM_PROCESSES=3 and TFJAX_PROCESS_ID=2, or raise the timeout"
    )
    assert ends[1] == f"the job did not start; process 0 says: {ends[0]}"
    alone = _run((address, 2, 1), wait=1)[1]  # and process 0 that never comes
    assert alone.startswith(f"the coordinator at {address} (process 0) did not answer within 1 s")


def test_an_unresolvable_coordinator_host_is_one_line_at_once():
    started = time.monotonic()
    ends = _run(("no-such-host.invalid:12355", 2, 0), ("no-such-host.invalid:12355", 2, 1))
    assert time.monotonic() - started < 4  # not the wait
    for end in ends.values():
        assert end.startswith(
            "TFJAX_COORDINATOR_ADDRESS=no-such-host.invalid:12355: the host "
            "'no-such-host.invalid' does not resolve ("
        ), end


def _listener(answer: bytes | None) -> socket.socket:
    """Another program on a port: it answers `answer` to what it reads, or stays silent."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn = server.accept()[0]
        with conn:
            conn.recv(1000)
            if answer is not None:
                conn.sendall(answer)
            else:
                conn.recv(1000)  # until the other side gives up

    threading.Thread(target=serve, daemon=True).start()
    return server


@pytest.mark.parametrize(
    "answer, words",
    [
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "something else listens at {}: it answered b'HTTP"),
        (b"", "something at {} closed the connection without answering as process 0"),
        (None, "something at {} accepted the connection but did not answer as process 0"),
    ],
)
def test_a_port_where_something_else_listens_is_one_line(monkeypatch, answer, words):
    monkeypatch.setattr(rendezvous, "ACK_SECONDS", 0.5)
    server = _listener(answer)
    with server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        end = _run((address, 2, 1))[1]
    assert end.startswith(words.format(address)), end
    assert "TFJAX_COORDINATOR_ADDRESS" in end


def test_two_processes_with_one_id_stop_the_job():
    address = _address()
    ends = _run((address, 3, 0), (address, 3, 1), (address, 3, 1), wait=3)
    assert ends[0].startswith("two processes have id 1: process 1 on "), ends[0]
    assert ends[0].endswith("give every process its own TFJAX_PROCESS_ID, 0 to 2")
    assert ends[1] == f"the job did not start; process 0 says: {ends[0]}"


def _serve_in_thread(address: str, count: int, wait: float) -> tuple[threading.Thread, dict]:
    """Process 0 serving `address` in a thread, once its port listens; and where it ends."""
    end = {}

    def serve():
        try:
            rendezvous.serve(rendezvous.Shape(address, count, 0, NAMES), wait)
            end[0] = "ok"
        except errors.DistributedError as err:
            end[0] = str(err)

    thread = threading.Thread(target=serve)
    thread.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", int(address.rpartition(":")[2]))):
                return thread, end  # (process 0 ignores a connection that says nothing)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.02)


def test_two_processes_with_id_0_stop_the_job():
    address = _address()
    port = address.rpartition(":")[2]
    thread, first = _serve_in_thread(address, 2, 1)
    second = _run((address, 2, 0))[0]  # on one machine: the port is taken
    thread.join()
    assert second.startswith(f"process 0 cannot serve the coordinator on port {port} (Address")
    assert "is another process 0 running" in second
    assert first[0].startswith("process 1 of 2 did not join")
    # On two machines both serve; the second one's hello to the address reaches the first.
    thread, first = _serve_in_thread(address, 2, 5)
    hello = dict(protocol=rendezvous.PROTOCOL, process_id=0, num_processes=2, host="other")
    hello.update(pid=7, nonce="another process's")
    with socket.create_connection(("127.0.0.1", int(port)), timeout=5) as conn:
        conn.sendall(json.dumps(hello).encode() + b"\n")
        reply = json.loads(conn.makefile("rb").readline())
    thread.join()
    assert first[0].startswith("two processes have id 0: process 0 on ")
    assert "and process 0 on other (pid 7): give every process its own" in first[0]
    assert reply["error"] == first[0]


def test_process_0_must_be_reachable_at_its_own_address(monkeypatch):
    monkeypatch.setattr(rendezvous, "ACK_SECONDS", 1)
    address = f"192.0.2.1:{portpicker.pick_unused_port()}"  # TEST-NET-1: no machine here
    end = _run((address, 2, 0))[0]
    assert end.startswith(f"process 0 cannot reach its own coordinator address {address} ("), end
    assert end.endswith(
        "TFJAX_COORDINATOR_ADDRESS must name the machine process 0 runs on, "
        "and a port nothing else uses"
    )


def test_a_process_that_left_while_waiting_is_waited_for_again():
    address = _address()
    thread, first = _serve_in_thread(address, 3, 10)
    hello = dict(protocol=rendezvous.PROTOCOL, process_id=1, num_processes=3, host="h")
    hello.update(pid=1, nonce="n")
    with socket.create_connection(("127.0.0.1", int(address.rpartition(":")[2]))) as conn:
        conn.sendall(json.dumps(hello).encode() + b"\n")  # process 1 checks in and dies
        assert json.loads(conn.makefile("rb").readline())["waiting_for"] == [2]
    time.sleep(0.3)
    assert _run((address, 3, 1), (address, 3, 2)) == {1: "ok", 2: "ok"}  # it comes back
    thread.join()
    assert first == {0: "ok"}


def test_a_process_that_comes_again_before_its_departure_was_seen_is_admitted():
    """Its new hello is read before process 0's loop looked for departed peers: the closed
    connection of its earlier self is found then, instead of "two processes have id 1"."""
    lobby = rendezvous._Lobby(rendezvous.Shape("127.0.0.1:1", 3, 0, NAMES), 10)
    hello = dict(protocol=rendezvous.PROTOCOL, process_id=1, num_processes=3, host="h", pid=1)

    def check_in(nonce: str) -> socket.socket:
        process, coordinator = socket.socketpair()
        process.sendall(json.dumps({**hello, "nonce": nonce}).encode() + b"\n")
        lobby.admit(coordinator)
        return process

    check_in("first").close()  # checks in, dies
    again = check_in("second")  # and comes again
    assert lobby.missing() == [2] and lobby.peers[1][1]["nonce"] == "second"
    with pytest.raises(errors.DistributedError, match="two processes have id 1"):
        check_in("third")  # while the second one still waits: a real duplicate
    again.close()
