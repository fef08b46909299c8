"""The training tool as a launcher's task, for tests/test_launchers.py,
tests/test_cluster_resolution.py and tests/test_worker_start.py: a SLURM job
whose ports are free here, the variables srun sets in a task, an environment
without a cluster of its own, and the tool started and finished in child
processes."""

import os
import socket
import subprocess

import numpy as np

from tests.processes import CHILD_TIMEOUT
from tests.processes import finish as processes_finish
from tests.train_tool import ROOT
from tests.train_tool import tool_command

TIMEOUT = CHILD_TIMEOUT


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("localhost", port))
            return True
        except OSError:
            return False


def free_slurm_job(tasks=2):
    """A SLURM_JOB_ID whose derived ports are free here: the TF tasks'
    (12000 + 16 * (id mod 1250) + 0..tasks-1) and JAX's coordinator's
    (61440 + id mod 4096)."""
    rng = np.random.default_rng()
    for _ in range(200):
        job = int(rng.integers(1, 10**6))
        base = 12000 + 16 * (job % 1250)
        ports = [base + i for i in range(tasks)] + [61440 + job % 4096]
        if all(_bindable(port) for port in ports):
            return job
    raise RuntimeError("no free ports for a SLURM job id")


def slurm_env(job, procid, tasks=2, node="localhost"):
    """The variables srun sets in task `procid` of a `tasks`-task step on one node."""
    return {
        "SLURM_JOB_ID": str(job),
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid),
        "SLURM_NTASKS": str(tasks),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NODELIST": node,
        "SLURM_STEP_TASKS_PER_NODE": str(tasks),
        "SLURMD_NODENAME": node,
    }


def child_env(**extra):
    """This environment without any cluster of its own, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TF_CONFIG"))}
    return dict(env, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **extra)


def start(args, env, **options):
    """The tool in a child process, its output read as text; stderr goes with
    stdout unless `options` (more of Popen's arguments) say otherwise."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    return subprocess.Popen(tool_command(*args), cwd=ROOT, env=env, **{**streams, **options})


def finish(processes):
    """[(exit status, output)] of the processes; kills what is left on a timeout."""
    return [(code, output) for code, output, _ in processes_finish(processes, TIMEOUT)]
