"""Test helpers of the start-up handshake (keras_lars.rendezvous), shared by
tests/test_rendezvous.py (who gets in), tests/test_disagreeing_processes.py
and tests/test_worker_start.py: JAX's task names, a call run in a thread (a
chief that waits for its peers), and rendezvous.meet on localhost."""

import threading

from keras_lars import rendezvous


def jax_tasks(count, port):
    """JAX's task names for `count` processes, as wait_for_processes gives them."""
    tasks = {("process", i): f"process {i}" for i in range(count)}
    tasks["process", 0] = f"process 0 at localhost:{port}"
    return tasks


def in_thread(function, *args, **kwargs):
    """Starts function(*args, **kwargs) in a thread; returns (thread, outcome):
    outcome gets the result or the error."""
    outcome = []

    def run():
        try:
            outcome.append(function(*args, **kwargs))
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def meet(me, tasks, port, seconds=60, **kwargs):
    return rendezvous.meet(me, tasks, f"localhost:{port}", seconds, **kwargs)
