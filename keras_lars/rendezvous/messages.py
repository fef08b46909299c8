"""The messages of the start-up handshake (keras_lars.rendezvous): their
fields, their proof (HMAC-SHA256 over the message, the run and both nonces)
and the checks of those received; the error both sides raise."""

import hashlib
import hmac
import json

PROTOCOL = "keras_lars.rendezvous/2"
MAX_LINE = 65536  # bytes of one message
HELLO_SECONDS = 5.0  # a connection's time to send each message, and the chief's to answer
WRONG_PROOF = "a wrong proof (another run, or another secret)"
_HELLO_FIELDS = {"protocol", "task", "status", "nonce", "proof"}
_SETTINGS_FIELDS = {"protocol", "status", "settings", "proof"}
_ANSWER_FIELDS = {"protocol", "status", "reason", "settings", "proof"}
_REFUSAL_FIELDS = {"protocol", "status", "reason"}


class HandshakeError(ValueError):
    """The tasks' settings differ, or a peer's address answers as something
    other than this run's chief."""


def differences(settings_of):
    """The settings whose values differ among `settings_of` ({task name:
    {name: value}}), each as "name: value on task, value on task" (tasks
    that share a value joined by "and"), joined by "; "; "" if none."""
    names = dict.fromkeys(name for values in settings_of.values() for name in values)
    found = []
    for name in names:
        holders = {}
        for task, values in settings_of.items():
            shown = json.dumps(values.get(name, "(unset)"), sort_keys=True).strip('"')
            holders.setdefault(shown, []).append(task)
        if len(holders) > 1:
            parts = [f"{value} on {' and '.join(who)}" for value, who in holders.items()]
            found.append(f"{name}: {', '.join(parts)}")
    return "; ".join(found)


def _name(task):
    return f"{task[0]} {task[1]}"


def _canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class _NotOurs(ValueError):
    """A line that is not the expected message of this run; `answer`: it
    speaks the protocol, so it is answered "refused"."""

    def __init__(self, why, answer):
        super().__init__(why)
        self.answer = answer


class _Hello:
    """This task's messages, and the checks of those it receives."""

    def __init__(self, run, settings, secret_dir):
        self.run = json.loads(json.dumps(run))  # as the peers will see them
        self.settings = json.loads(json.dumps(settings))
        self.secret_dir = secret_dir

    def signed(self, key, nonces, **fields):
        fields = {"protocol": PROTOCOL, **fields}
        return _canonical({**fields, "proof": self._proof(key, nonces, fields)}) + b"\n"

    def _proof(self, key, nonces, fields):
        signed = _canonical({"run": self.run, "nonces": nonces, "fields": fields})
        return hmac.new(key, signed, hashlib.sha256).hexdigest()

    def verify(self, key, nonces, fields):
        """Raises _NotOurs unless `fields` (a message with its proof) is signed with `key`."""
        fields = dict(fields)
        proof = fields.pop("proof")
        if not isinstance(proof, str) or not hmac.compare_digest(
            proof, self._proof(key, nonces, fields)
        ):
            raise _NotOurs(WRONG_PROOF, True)

    # The chief's side.
    @staticmethod
    def challenge(nonce, kind):
        return _canonical({"protocol": PROTOCOL, "challenge": nonce, "key": kind}) + b"\n"

    @staticmethod
    def refusal(reason):
        """A refusal before (or without) the proof: the reason alone."""
        return _canonical({"protocol": PROTOCOL, "status": "refused", "reason": reason}) + b"\n"

    def read_hello(self, line, key, challenge):
        """(task, nonce) of a hello answering `challenge`; _NotOurs (why)
        unless it is a well-formed one with a valid proof."""
        fields = _message(line, _HELLO_FIELDS)
        task, nonce = fields["task"], fields["nonce"]
        well_formed = (
            isinstance(task, list)
            and len(task) == 2
            and isinstance(task[0], str)
            and type(task[1]) is int
            and fields["status"] == "hello"
            and isinstance(nonce, str)
            and len(nonce) <= 64
        )
        if not well_formed:
            raise _NotOurs("a malformed hello", True)
        self.verify(key, [challenge, nonce], fields)
        return tuple(task), nonce

    def read_settings(self, line, key, nonces):
        fields = _message(line, _SETTINGS_FIELDS)
        if fields["status"] != "settings" or not isinstance(fields["settings"], dict):
            raise _NotOurs("malformed settings", True)
        self.verify(key, nonces, fields)
        return fields["settings"]


def _message(line, names):
    """The fields of a message with the fields `names`; _NotOurs if it is none."""
    try:
        fields = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _NotOurs(f"not a keras_lars hello: {line[:60]!r}", False) from None
    if not isinstance(fields, dict) or fields.get("protocol") is None:
        raise _NotOurs(f"not a keras_lars hello: {line[:60]!r}", False)
    if fields["protocol"] != PROTOCOL:
        raise _NotOurs(f"speaks {str(fields['protocol'])[:40]!r}, not {PROTOCOL}", True)
    if set(fields) != names:
        raise _NotOurs("a malformed hello", True)
    return fields
