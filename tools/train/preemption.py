"""Stopping without losing anything: signals, exit status 75 and lost peers.

SIGTERM or SIGINT asks the run to stop at the next step boundary, after a
checkpoint (Preempted; the tool exits 75, EX_TEMPFAIL: run it again). On a
cluster the runtime makes every process stop at the same step (runtime.py).
"""

import contextlib
import signal
import sys
import threading

from keras_lars.tools import storage
from keras_lars.tools.train import model_dir

EXIT_PREEMPTED = 75  # the exit status after SIGTERM / SIGINT (EX_TEMPFAIL: run it again)


class Preempted(Exception):
    """Training stopped by SIGTERM or SIGINT after saving a checkpoint."""


class Preemption:
    """Turns SIGTERM and SIGINT into a request that training honours at the
    next step boundary (a checkpoint, then Preempted). A second SIGINT
    stops at once (KeyboardInterrupt)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signal = None

    def _handle(self, number, frame):
        if self.signal is not None and number == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(number).name
        print(f"{self.signal} received: {self._action}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def handling(self, enabled=True, action="saving a checkpoint at the next step boundary"):
        """Handles the signals for the block (only in the main thread)."""
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._action = action
        previous = {number: signal.getsignal(number) for number in self.SIGNALS}
        for number in self.SIGNALS:
            signal.signal(number, self._handle)
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)


class NoClusterPreemption:
    """One process: SIGTERM is handled by the process itself (Preemption)."""

    def at_step(self, step, done):
        pass


def describe_lost_peer(error, values, collective_failed, who):
    """The one line for `error` when it says that another worker or process
    of the run died (`collective_failed(cause, values)` true for an error in
    its chain of causes), naming the checkpoint a rerun resumes from; None
    otherwise. `values`: the flag values; `who`: "workers" or "processes"."""
    causes = [error]  # and what failed a checkpoint's write (Keras's fit drops __cause__)
    while (causes[-1].__cause__ or causes[-1].__context__) and len(causes) < 8:
        causes.append(causes[-1].__cause__ or causes[-1].__context__)
    found = [cause for cause in causes if collective_failed(cause, values)]
    if not found:
        return None
    last = model_dir.last_checkpoint(values["model_dir"])
    resumes = f"its last checkpoint, {last[0]}" if last else "the start"
    cause = storage.first_line(found[0])[:300].rstrip(":")
    return (
        f"a step across the run's {who} failed, most likely because another one stopped "
        f"({cause}); run every one again with the same command: the run resumes from {resumes}"
    )
