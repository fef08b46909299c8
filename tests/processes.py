"""Real processes the tests start: waiting for them without leaving any behind."""


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
