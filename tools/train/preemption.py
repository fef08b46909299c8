"""Stopping without losing anything: signals, exit status 75 and lost peers.

SIGTERM, SIGHUP (a closed terminal or ssh session) or SIGINT asks the run to
stop at the next step boundary, after a checkpoint (Preempted; the tool exits
75, EX_TEMPFAIL: run it again). On a cluster the runtime makes every process
stop at the same step on SIGTERM (runtime.py); SIGHUP is passed on to it as
SIGTERM.
"""

import contextlib
import signal
import sys
import threading

from keras_lars.tools import storage
from keras_lars.tools.train import model_dir

EXIT_PREEMPTED = 75  # the exit status after SIGTERM / SIGHUP / SIGINT (EX_TEMPFAIL: run it again)
# SIGHUP: the terminal or ssh session closed (POSIX only).
_HANGUP = (signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()


class Preempted(Exception):
    """Training stopped by SIGTERM, SIGHUP or SIGINT after saving a checkpoint."""


class Preemption:
    """Turns SIGTERM, SIGHUP and SIGINT into a request that training honours
    at the next step boundary (a checkpoint, then Preempted). A second
    SIGINT stops at once (KeyboardInterrupt)."""

    SIGNALS = (signal.SIGTERM, *_HANGUP, signal.SIGINT)

    def __init__(self):
        self.signal = None
        self._action = None

    def _handle(self, number, frame):
        if self.signal is not None and number == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(number).name
        print(f"{self.signal} received: {self._action}", file=sys.stderr, flush=True)

    @staticmethod
    def _pass_on_as_sigterm(number, frame):
        print("SIGHUP received: passed on as SIGTERM", file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGTERM)

    @contextlib.contextmanager
    def handling(self, enabled=True, action="saving a checkpoint at the next step boundary"):
        """Handles the signals for the block (only in the main thread). Not
        `enabled` (a cluster's handler takes SIGTERM): SIGHUP becomes SIGTERM.

        Inside another Preemption's block (the study's around a cell's run),
        a signal that one received before counts here, and one received here
        counts there after the block."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        outer_action, self._action = self._action, action
        handled = self.SIGNALS if enabled else _HANGUP
        handler = self._handle if enabled else self._pass_on_as_sigterm
        previous = {number: signal.getsignal(number) for number in handled}
        outer = next(
            (
                owner
                for owner in (getattr(h, "__self__", None) for h in previous.values())
                if isinstance(owner, Preemption) and owner is not self
            ),
            None,
        )
        if enabled and outer is not None and self.signal is None:
            self.signal = outer.signal
        for number in handled:
            signal.signal(number, handler)
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
            self._action = outer_action  # a block around this one says its own
            if outer is not None and outer.signal is None:
                outer.signal = self.signal


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
