"""Real processes the tests start: waiting for them without leaving any behind."""

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
