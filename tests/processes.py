"""Real processes the tests start: waiting for them without leaving any behind."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Seconds a test waits for one child process (a tool run, a worker): a guard
# against hangs, never a speed gate. CI's machine ran the suite 2.1x slower
# than ours on 2026-12-02 (4,142 s against 1,982 s), and 300 s failed
# two-worker runs there that take 130-180 s here.
CHILD_TIMEOUT = 900


def finish(processes, timeout):
    """[(return code, stdout, stderr)] of each of `processes` (Popen), in
    order; on a timeout (subprocess.TimeoutExpired) or any other error, the
    ones still running are killed and reaped before it propagates."""
    try:
        outputs = [p.communicate(timeout=timeout) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out, err) for p, (out, err) in zip(processes, outputs)]


def json_report_on_jax(module, *args):
    """The last line of `python -m module args`'s output, read as JSON, run on
    Keras's JAX backend (the CPU) in a fresh process; fails the test with its
    stderr's end unless it exits 0."""
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
