"""The start-up handshake of a run's tasks: a star around the chief.

TensorFlow's and JAX's own starts wait for their peers silently and take any
program listening on a peer's address for the peer. Before them, every task
meets the chief over TCP and proves, by challenge and response, that it holds
the run's secret; the chief proves the same back before it hears anything of
the task's settings:

    chief -> task    challenge   {protocol, challenge: nonce, key: where the key is}
    task  -> chief   hello       {protocol, task, status: "hello", nonce, proof}
    chief -> task    "waiting"   (signed: the chief holds the key too), or
                     "refused"   {protocol, status, reason}: nothing of the run
    task  -> chief   settings    {protocol, status: "settings", settings, proof}
    chief -> task    "go" once every task is in with equal settings, else
                     "refused" naming the settings that differ (both signed,
                     with the chief's settings)

Each message is one JSON line of at most MAX_LINE bytes; each signed one carries

    proof = HMAC-SHA256(key, canonical JSON of the message's fields, the run's
                        identity and both nonces)

so that a hello answers one challenge only (no replay) and no message of one
connection or direction passes for another. The key (`key` in the challenge):

    "variable"     $KERAS_LARS_RUN_SECRET, where set (the same on every task):
                   UTF-8 text of at least 16 characters, without whitespace at
                   its ends (else a ValueError naming it)
    "file:<id>"    else, where the tasks share a directory (the training tool:
                   --model_dir): 32 random bytes the chief writes there for this
                   start, as `.keras_lars_start_<id>`, created at once with
                   owner-only permissions (0600, O_EXCL), locked while the start
                   lasts and removed when it ends (a chief's next start removes,
                   naming it, one that no chief holds: its chief was killed);
                   the others read it. On a bucket (gs://...) there
                   are no file permissions: whoever can read the bucket can read
                   it, and the chief says so in one warning line.
    "none"         else: SHA-256 of the run's identity, which proves nothing
                   (a guard against strays, not attackers); one warning line.

The chief listens on its own address only (that host, not every interface;
`listen_host` says where a name resolves to loopback only), serves every
connection at once (a connection that sends no hello, or no settings, within
messages.HELLO_SECONDS, or more than MAX_LINE bytes, is dropped), admits only a
well-formed hello with a valid proof from a task not yet seen, logging one line
for each ("admitted {task} from {address}"); anything else is logged once
(who, why) and answered "refused" with the reason where it speaks the protocol.
Once every task is in it compares their settings: equal, it answers "go"; else
every task gets "refused" and the chief raises HandshakeError naming each
setting that differs and who holds which value.

What it does not protect: TensorFlow's gRPC servers and JAX's coordination
service, which start after it on the same hosts, accept any connection;
keep their ports to the run's hosts (a firewall, a Kubernetes NetworkPolicy,
a VPC firewall rule).

The parts, each a module of this package (each imports only those above it):
`messages` (the fields, the proof and HandshakeError; HELLO_SECONDS is read
from it at each use), `key` (the chief's key and how the tasks find it),
`clock` (the wait's deadline and lines), `addresses` (host:port, what to
bind), `chief` (the chief's side) and `task` (the other tasks' side); this
module holds `meet` and names the public parts.
"""

from keras_lars.rendezvous.addresses import accepts_connections
from keras_lars.rendezvous.addresses import listen_host
from keras_lars.rendezvous.addresses import split_address
from keras_lars.rendezvous.chief import MAX_PENDING
from keras_lars.rendezvous.chief import _gather
from keras_lars.rendezvous.clock import _Clock
from keras_lars.rendezvous.key import SECRET_PREFIX
from keras_lars.rendezvous.key import SECRET_VARIABLE
from keras_lars.rendezvous.key import _variable_key
from keras_lars.rendezvous.messages import MAX_LINE
from keras_lars.rendezvous.messages import PROTOCOL
from keras_lars.rendezvous.messages import WRONG_PROOF
from keras_lars.rendezvous.messages import HandshakeError
from keras_lars.rendezvous.messages import _Hello
from keras_lars.rendezvous.messages import differences
from keras_lars.rendezvous.task import _join
from keras_lars.rendezvous.task import _Reserved

__all__ = [
    "meet",
    "HandshakeError",
    "differences",
    "split_address",
    "accepts_connections",
    "listen_host",
    "PROTOCOL",
    "SECRET_VARIABLE",
    "SECRET_PREFIX",
    "MAX_LINE",
    "MAX_PENDING",
    "WRONG_PROOF",
]


def meet(
    me,
    tasks,
    chief_address,
    timeout_seconds,
    *,
    run=None,
    settings=None,
    own_address=None,
    addresses=None,
    others="other tasks",
    log=print,
    report_every_seconds=30.0,
    stop=None,
    secret_dir=None,
):
    """Returns once every task of `tasks` has met the chief with the same
    `settings`: the number of the other tasks. HandshakeError if the
    settings differ or the chief's address answers as something else;
    ValueError naming $KERAS_LARS_RUN_SECRET where it is set but not UTF-8
    text of at least 16 characters without whitespace at its ends.

    Args:
        me: this task, a key of `tasks`: (job, index).
        tasks: {(job, index): label} of every task of the run, the chief first.
        chief_address: "host:port" the chief listens on.
        timeout_seconds: float > 0: TimeoutError naming the missing tasks after that.
        run: JSON-able identity of the run (tasks of another run are refused).
        settings: {name: value} every task must share (JSON-able).
        own_address: "host:port" a non-chief reserves while it waits (an
            OSError naming it at once if taken).
        addresses: {(job, index): "host:port"}: at the timeout, a missing
            task's address that accepts connections is named.
        others: the other tasks as a phrase ("1 of the 3 {others}: ...").
        log: receives a "waiting for ..." line every `report_every_seconds`
            and, on the chief, one line per task it admits, one per
            connection it ignores (who, why) and the warning of a start
            without a secret only the run can read.
        stop: None or a callable returning a reason (e.g. a signal name) to
            give up: InterruptedError.
        secret_dir: a directory every task reads (a path, or a gs:// URL read
            through tf.io.gfile) where, without $KERAS_LARS_RUN_SECRET, the
            chief writes this start's secret (see the module docstring).
    """
    if not timeout_seconds > 0:
        raise ValueError(f"`timeout_seconds` must be > 0, received {timeout_seconds!r}.")
    tasks = {tuple(task): label for task, label in tasks.items()}
    chief = next(iter(tasks))
    if len(tasks) == 1:
        return 0
    _variable_key()  # a $KERAS_LARS_RUN_SECRET that is not one: ValueError, before anything
    hello = _Hello(run, settings or {}, secret_dir)
    clock = _Clock(timeout_seconds, report_every_seconds, log, stop)
    if chief == tuple(me):
        return _gather(hello, tasks, chief_address, clock, addresses or {}, others)
    with _Reserved(own_address):
        _join(hello, tuple(me), tasks, chief_address, clock, others)
    return len(tasks) - 1
