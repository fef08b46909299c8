"""A stranger at a chief's start (keras_lars.rendezvous), as a real process:

    python tests/forger.py PORT JOB INDEX RUN_JSON SETTINGS_JSON MODEL_DIR SECONDS

It knows what an outsider can learn (the port, the run's cluster, its
settings) and nothing else: it waits for the chief at PORT (at most SECONDS),
tries to read the secret file the challenge names in MODEL_DIR (started as
root, it first becomes user nobody, 65534, so that it cannot; as any other
user it does not try, being the run's user), answers the
challenge as task [JOB, INDEX] with a proof keyed by what it read, else by the
run and the settings (the key the hello of keras_lars.rendezvous/1 had without
$KERAS_LARS_RUN_SECRET). It prints a JSON line when the chief's challenge
came ({"challenged": true}; the test starts the real task only then: the
stranger must meet the start, not the server that follows it), then one
more: {"read": what reading the secret gave, "answer": the chief's answer,
as text}; never having met a chief, one line {"read": null, "answer": null}.
"""

import encodings.idna  # noqa: F401 (loaded before the user changes)
import hashlib
import hmac
import json
import os
import socket
import sys
import time


def _canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def main(port, job, index, run, settings, model_dir, seconds):
    outsider = os.geteuid() == 0
    if outsider:  # another user than the run's (its modules are loaded)
        os.setgid(65534)
        os.setuid(65534)
    deadline = time.monotonic() + float(seconds)
    while True:
        try:
            sock = socket.create_connection(("localhost", int(port)), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                print(json.dumps({"read": None, "answer": None}), flush=True)
                return
            time.sleep(0.02)
    sock.settimeout(max(10.0, deadline - time.monotonic()))  # a loaded machine: slow
    lines = sock.makefile("rb")
    challenge = json.loads(lines.readline())
    print(json.dumps({"challenged": True}), flush=True)
    run, settings = json.loads(run), json.loads(settings)
    key = hashlib.sha256(_canonical([run, settings])).digest()
    read = "no secret file named"
    kind = str(challenge.get("key"))
    if kind.startswith("file:") and not outsider:
        read = "not tried: it runs as the run's user (not root, it cannot become another)"
    elif kind.startswith("file:"):
        path = os.path.join(model_dir, ".keras_lars_start_" + kind.split(":", 1)[1])
        try:
            with open(path, "rb") as f:
                key = f.read()
            read = "read it"
        except OSError as error:
            read = type(error).__name__
    nonce = "f" * 32
    fields = {
        "protocol": challenge["protocol"],
        "task": [job, int(index)],
        "status": "hello",
        "nonce": nonce,
    }
    signed = _canonical({"run": run, "nonces": [challenge["challenge"], nonce], "fields": fields})
    fields["proof"] = hmac.new(key, signed, hashlib.sha256).hexdigest()
    sock.sendall(_canonical(fields) + b"\n")
    answer = lines.readline().decode()
    print(json.dumps({"read": read, "answer": answer}), flush=True)


def start(port, task, run, settings, model_dir, seconds=900):
    """This script as a process (Popen) forging a hello of `task` at `port`."""
    import subprocess

    command = [sys.executable, os.path.abspath(__file__), str(port), task[0], str(task[1])]
    command += [json.dumps(run), json.dumps(settings), str(model_dir), str(seconds)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def challenged(process):
    """Waits until the forger (`start`) has the chief's challenge; it stops
    by itself at its SECONDS when no chief comes (then an AssertionError)."""
    line = b""  # read unbuffered: what follows is communicate()'s (`result`)
    while not line.endswith(b"\n") and (byte := os.read(process.stdout.fileno(), 1)):
        line += byte
    if json.loads(line or b"{}").get("challenged"):
        return
    process.kill()
    _, errors = process.communicate()
    raise AssertionError(f"the forger met no chief: {line!r} {errors[-3000:]}")


def result(process, timeout=900):
    """{"read", "answer"} the forger printed (None if it never met a chief)."""
    try:
        output, errors = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, errors[-3000:]
    return json.loads(output.strip().splitlines()[-1])


if __name__ == "__main__":
    main(*sys.argv[1:])
