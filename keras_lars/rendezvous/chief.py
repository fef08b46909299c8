"""The chief's side of keras_lars.rendezvous: it holds its address and
serves every connection at once until each task is in, then answers "go"
or "refused"."""

import secrets
import selectors
import socket
import time

from keras_lars.rendezvous import messages
from keras_lars.rendezvous.addresses import _family
from keras_lars.rendezvous.addresses import accepts_connections
from keras_lars.rendezvous.addresses import listen_host
from keras_lars.rendezvous.addresses import split_address
from keras_lars.rendezvous.key import _Secret
from keras_lars.rendezvous.messages import MAX_LINE
from keras_lars.rendezvous.messages import HandshakeError
from keras_lars.rendezvous.messages import _name
from keras_lars.rendezvous.messages import _NotOurs
from keras_lars.rendezvous.messages import differences

MAX_PENDING = 64  # connections not yet in; beyond, the oldest is dropped


class _Connection:
    def __init__(self, sock, peer):
        self.sock, self.peer = sock, f"{peer[0]}:{peer[1]}"
        self.received, self.task, self.settings = b"", None, None
        self.challenge, self.nonce = secrets.token_hex(16), None
        self.deadline = time.monotonic() + messages.HELLO_SECONDS

    def send(self, line):
        """Sends `line`; False if the peer is gone."""
        try:
            self.sock.settimeout(messages.HELLO_SECONDS)
            self.sock.sendall(line)
            self.sock.setblocking(False)
            return True
        except OSError:
            return False


def _gather(hello, tasks, address, clock, addresses, others):
    """The chief's side: holds its address, then serves every connection at
    once until each task of `tasks` is in (the key: `_Secret`); then "go", or
    "refused" and HandshakeError."""
    host, port = split_address(address)
    try:
        bound = listen_host(host)
        server = socket.create_server((bound, port), family=_family(bound), backlog=64)
    except OSError as error:
        raise OSError(f"cannot listen on this task's address {address}: {error}") from None
    try:
        with _Secret(hello.secret_dir, hello.run, clock.log, address) as secret:
            return _serve(hello, secret, server, tasks, clock, addresses, others)
    finally:
        server.close()


def _serve(hello, secret, server, tasks, clock, addresses, others):
    chief = next(iter(tasks))
    expected = [task for task in tasks if task != chief]
    arrived, pending = {}, {}  # task: _Connection (admitted); socket: _Connection (not all in)
    selector = selectors.DefaultSelector()
    server.setblocking(False)
    selector.register(server, selectors.EVENT_READ)

    def drop(connection, why=None, answer=False):
        """Closes `connection`, logging `why` (and answering it "refused")."""
        if why:
            clock.log(f"ignored a connection from {connection.peer}: {why}")
            if answer:
                connection.send(hello.refusal(why))
        pending.pop(connection.sock, None)
        if connection.task and arrived.get(connection.task) is connection:
            del arrived[connection.task]
            clock.log(f"{tasks[connection.task]} left before the start; waiting for it again")
        selector.unregister(connection.sock)
        connection.sock.close()

    def admit(connection, line):
        try:
            task, nonce = hello.read_hello(line, secret.key, connection.challenge)
        except _NotOurs as error:
            return drop(connection, str(error), error.answer)
        # The proof is valid: the sender holds the key, and may hear the tasks' names.
        if task not in expected:
            known = ", ".join(_name(t) for t in tasks)
            return drop(connection, f"{_name(task)} is not a task of this run ({known})", True)
        if task in arrived:
            return drop(connection, f"{_name(task)} has already arrived", True)
        connection.task, connection.nonce = task, nonce
        connection.deadline = time.monotonic() + messages.HELLO_SECONDS
        arrived[task] = connection
        clock.log(f"admitted {tasks[task]} from {connection.peer}")
        nonces = [connection.challenge, nonce]
        if not connection.send(hello.signed(secret.key, nonces, status="waiting", task=list(task))):
            drop(connection)

    def settle(connection, line):
        nonces = [connection.challenge, connection.nonce]
        try:
            connection.settings = hello.read_settings(line, secret.key, nonces)
        except _NotOurs as error:
            return drop(connection, str(error), error.answer)
        del pending[connection.sock]

    def receive(connection):
        try:
            chunk = connection.sock.recv(4096)
        except OSError:
            chunk = b""
        if not chunk:
            drop(connection, None if connection.task else "closed before its hello")
            return
        if connection.settings is not None:
            return  # all in: nothing more to hear
        connection.received += chunk
        while b"\n" in connection.received and connection.sock in pending:
            line, connection.received = connection.received.split(b"\n", 1)
            (settle if connection.task else admit)(connection, line)
        if connection.sock in pending and len(connection.received) > MAX_LINE:
            drop(connection, f"sent more than {MAX_LINE} bytes without a hello")

    def missing():
        names = [tasks[task] for task in expected if task not in arrived]
        return f"{len(names)} of the {len(expected)} {others}: {', '.join(names)}"

    def taken():  # at the timeout: a missing task's address held by another program
        return "".join(
            f"; something that is not this run's task accepts connections at {addresses[task]}"
            for task in expected
            if task not in arrived and task in addresses and accepts_connections(addresses[task])
        )

    def all_in():
        return len(arrived) == len(expected) and all(
            c.settings is not None for c in arrived.values()
        )

    try:
        while not all_in():
            clock.tick(missing(), taken)
            for key, _ in selector.select(timeout=0.2):
                if key.fileobj is server:
                    _accept(server, selector, pending, drop, hello, secret)
                elif key.data.sock in pending or arrived.get(key.data.task) is key.data:
                    receive(key.data)
            for connection in list(pending.values()):
                if time.monotonic() > connection.deadline:
                    what = "settings" if connection.task else "hello"
                    drop(connection, f"no {what} within {messages.HELLO_SECONDS:g} s")
        settings_of = {_name(chief): hello.settings}
        settings_of.update({_name(t): arrived[t].settings for t in expected})
        differ = differences(settings_of)
        status, refusal = ("refused", f"settings differ: {differ}") if differ else ("go", "")
        for connection in arrived.values():
            nonces = [connection.challenge, connection.nonce]
            connection.send(
                hello.signed(
                    secret.key, nonces, status=status, reason=refusal, settings=hello.settings
                )
            )
        if differ:
            raise HandshakeError(refusal)
        return len(expected)
    finally:
        for connection in [*pending.values(), *arrived.values()]:
            connection.sock.close()
        selector.close()


def _accept(server, selector, pending, drop, hello, secret):
    while True:
        try:
            sock, peer = server.accept()
        except OSError:  # none left (or no file descriptor: the idle ones go below)
            return
        sock.setblocking(False)
        connection = _Connection(sock, peer[:2])
        pending[sock] = connection
        selector.register(sock, selectors.EVENT_READ, connection)
        connection.send(hello.challenge(connection.challenge, secret.kind))
        if len(pending) > MAX_PENDING:
            drop(next(iter(pending.values())), f"more than {MAX_PENDING} connections at once")
