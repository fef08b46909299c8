"""The clock of a wait in keras_lars.rendezvous: its deadline, its
"waiting for" lines and its stop."""

import time


class _Clock:
    """The wait's deadline, its "waiting for" lines and its stop."""

    def __init__(self, timeout_seconds, report_every_seconds, log, stop):
        self.timeout, self.every, self.log, self.stop = (
            timeout_seconds,
            report_every_seconds,
            log,
            stop,
        )
        self.started = self.reported = time.monotonic()

    def left(self):
        return self.started + self.timeout - time.monotonic()

    def tick(self, waiting_for, hint=""):
        """Raises InterruptedError once `stop()` says so, TimeoutError past
        the deadline (with `hint`, a text or a function giving one); logs
        "waiting for {waiting_for}" every so often."""
        reason = self.stop() if self.stop else None
        if reason:
            raise InterruptedError(f"stopped by {reason} while waiting for {waiting_for}")
        waited = time.monotonic() - self.started
        if waited >= self.timeout:
            hint = hint() if callable(hint) else hint
            raise TimeoutError(f"{waiting_for} did not start within {self.timeout:g} s{hint}")
        if time.monotonic() - self.reported >= self.every:
            self.reported = time.monotonic()
            self.log(f"waiting for {waiting_for} ({waited:.0f} of {self.timeout:g} s)")
