"""The start of a run's processes, shared by both runtimes (runtime.py's
TensorFlowRuntime, runtime_jax.py's JaxRuntime): the settings every process
must share (checked when they meet) and the watchdog that bounds the start.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading

from keras_lars.tools import settings


def shared_settings(config):
    """{"--name": value} of the settings every process (worker) of a run
    must share: those of `config` not declared `per_process`."""
    return {
        f"--{field.name}": getattr(config, field.name)
        for field in settings.fields(config)
        if not field.metadata["per_process"]
    }


# Python code cannot run while TensorFlow's start holds the interpreter lock,
# nor see SIGTERM there (TensorFlow's preemption notifier takes it, for every
# thread: the tool's own cannot all block it): a watchdog process bounds the
# start. It reads the signal numbers Python's own handler writes to its wakeup
# file descriptor (no lock needed), and on SIGINT or SIGHUP to the tool, on a
# SIGTERM to the watchdog itself (one sent to the process group, as SLURM,
# systemd or `kill -TERM -PGID` send it), or at the deadline, prints the line
# and kills the tool. It ignores SIGINT and SIGHUP itself (a Ctrl-C reaches
# the whole process group: the tool's handler reports it).
_WATCHDOG = """
import os, select, signal, sys, time
tool, seconds, on_signal, on_timeout = int(sys.argv[1]), float(sys.argv[2]), *sys.argv[3:]
for number in (signal.SIGINT, signal.SIGHUP):  # sent to the process group
    signal.signal(number, signal.SIG_IGN)
own, ours = os.pipe()
os.set_blocking(ours, False)
signal.set_wakeup_fd(ours)
signal.signal(signal.SIGTERM, lambda *_: None)  # the number comes through `own`
deadline = time.monotonic() + seconds
while True:
    ready = select.select([0, own], [], [], max(deadline - time.monotonic(), 0))[0]
    received = os.read(own, 64) if own in ready else os.read(0, 64) if ready else b""
    if ready and not received:  # the start is over (or the tool is gone)
        sys.exit(0)
    if received and received[0] not in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        continue
    line = on_signal.format(signal.Signals(received[0]).name) if received else on_timeout
    os.write(2, line.encode() + b"\\n")
    os.kill(tool, signal.SIGKILL)
    sys.exit(0)
"""
_WATCHED = (signal.SIGINT, signal.SIGHUP)  # SIGTERM: TensorFlow's, restored by no one


@contextlib.contextmanager
def bounded_start(config, starter, peers, a_peer):
    """Bounds the block, `starter`'s start of the `peers` (TensorFlow's
    MultiWorkerMirroredStrategy constructor, which waits for every worker
    holding Python's interpreter lock, or jax.distributed.initialize), to
    --worker_start_timeout_minutes, and ends it on SIGINT or SIGHUP, or on a
    SIGTERM to the process group: one line from the watchdog, then SIGKILL;
    nothing was trained. A SIGTERM to the tool's process alone is `starter`'s
    (both install a preemption handler for it): the deadline ends it."""
    seconds = 60 * config.worker_start_timeout_minutes
    on_signal = (
        f"preempted: stopped by {{}} while {starter} started the {peers}; nothing was "
        "trained; run the same command to start"
    )
    on_timeout = (
        f"error: --worker_start_timeout_minutes={config.worker_start_timeout_minutes:g}: "
        f"{starter}'s start of the {peers} did not finish within {seconds:g} s ({a_peer} "
        "stopped after meeting the others, or another program took its port?); nothing "
        "was trained"
    )
    if threading.current_thread() is not threading.main_thread():  # no signals there
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(seconds), on_signal, on_timeout],
        stdin=read,
    )
    os.close(read)
    handlers = {number: signal.signal(number, lambda *_: None) for number in _WATCHED}
    wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    print(f"{starter} starts the {peers} (at most {seconds:g} s)", flush=True)
    try:
        yield
    finally:
        signal.set_wakeup_fd(wakeup)
        os.close(write)  # the watchdog ends
        watchdog.wait()
        for number, handler in handlers.items():
            signal.signal(number, handler)
