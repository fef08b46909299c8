"""Where the other workers are: --cluster, resolved once at the start.

    tf_config  TF_CONFIG as it is: written by hand, by Kubeflow's TFJob or
               JobSet, or by Vertex AI (a `chief` task, if any, is task 0
               and the one that writes the model dir)
    slurm      the tasks of the srun step this process is one of
    auto       TF_CONFIG if set, else SLURM if SLURM_JOB_ID and SLURM_PROCID
               are (inside srun)

On TensorFlow (--strategy=multi_worker) the rest of the tool sees a
TF_CONFIG either way: `export_tf_config` writes SLURM's cluster into it
through TensorFlow's SlurmClusterResolver, which lists the step's tasks
node by node (SLURM_STEP_NODELIST, expanded by itself, no scontrol, on TF
2.17 to 2.21; SLURM_STEP_TASKS_PER_NODE; host names sorted) and makes task
SLURM_PROCID worker SLURM_PROCID, at

    host:(port_base + its index among its node's tasks)
    port_base = --cluster_port_base, or 12000 + 16 * (SLURM_JOB_ID mod 1250)

so that two jobs sharing a node listen on different ports (up to 16 tasks a
node; below Linux's ephemeral ports, 32768 and up). GPUs are SLURM's to
bind (srun --gpus-per-task); the tool leaves CUDA_VISIBLE_DEVICES alone.

On JAX, `slurm_processes` gives what jax.distributed.initialize detects
under SLURM (jax._src.clusters.SlurmCluster, the same on jax 0.5.3 and
0.10.2), so that the tool's own wait for the processes meets them where
JAX will:

    coordinator_address = first host of SLURM_STEP_NODELIST
                          : $JAX_COORDINATOR_PORT, else 61440 + SLURM_JOB_ID mod 4096
    num_processes = SLURM_NTASKS,  process_id = SLURM_PROCID

(jax 0.10.2 reads JAX_COORDINATOR_PORT, 0.5.3 does not; the tool hands all
three to jax.distributed.initialize, so either way JAX uses these; the tool
also uses them under --num_processes=0, where JAX would detect SLURM itself.)
JAX itself still picks each process's device under SLURM: SLURM_LOCALID.

Before anything lists SLURM_STEP_NODELIST's hosts, `node_count` counts them
from its ranges: a list naming more nodes than the step has tasks is refused
in one line (TensorFlow's resolver took 68 s to list n[0-99999999]).
"""

import json
import os
import re

from keras_lars.tools.settings import ConfigError

CLUSTERS = ("auto", "tf_config", "slurm")
# Set in every task of an srun step (SLURM_PROCID also in an sbatch script).
SLURM_MARKERS = ("SLURM_JOB_ID", "SLURM_PROCID")
# What TensorFlow's SlurmClusterResolver reads, and what JAX's detection reads.
SLURM_TF_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)
SLURM_JAX_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_STEP_NODELIST",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
)
PORTS_PER_JOB = 16
SLURM_DETECTED = "--num_processes=0 (SLURM detected)"  # the flag JAX's detection stands for


def kind(cluster):
    """'tf_config' or 'slurm': what --cluster=`cluster` means here."""
    if cluster != "auto":
        return cluster
    if os.environ.get("TF_CONFIG", "").strip():
        return "tf_config"
    if all(name in os.environ for name in SLURM_MARKERS):
        return "slurm"
    raise ConfigError(
        "--strategy=multi_worker --cluster=auto: found no cluster here: TF_CONFIG is not set "
        f"and neither are SLURM's {' and '.join(SLURM_MARKERS)} (run it under srun); set "
        "TF_CONFIG, or see docs/launchers.md"
    )


def export_tf_config(config, log=print):
    """Under --strategy=multi_worker: sets TF_CONFIG to the cluster of
    --cluster (unchanged for tf_config), for the wait for the workers and the
    strategy. Logs one line for SLURM's cluster."""
    if kind(config.cluster) != "slurm":
        return
    tf_config = slurm_tf_config(config.cluster_port_base)
    os.environ["TF_CONFIG"] = json.dumps(tf_config)
    task, workers = tf_config["task"], tf_config["cluster"]["worker"]
    log(
        f"--cluster=slurm: SLURM task {os.environ['SLURM_PROCID']} of {len(workers)} is "
        f"{task['type']} {task['index']} at {workers[task['index']]}"
    )


def slurm_port_base():
    """The first port of the job's tasks on each node (see the module docstring)."""
    (job,) = _slurm_integers("SLURM_JOB_ID")
    return 12000 + PORTS_PER_JOB * (job % 1250)


def slurm_tf_config(port_base=0):
    """TF_CONFIG's dict of this SLURM task, from tf.distribute's
    SlurmClusterResolver (port_base 0: `slurm_port_base()`). ConfigError
    names a missing or invalid variable."""
    import tensorflow as tf

    task, tasks = _slurm_tf_task()
    try:
        # One "GPU" a task and as many on a node as the step has tasks: the
        # resolver only numbers the ports with them (auto_set_gpu off).
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=port_base or slurm_port_base(),
            gpus_per_node=tasks,
            gpus_per_task=1,
            auto_set_gpu=False,
        )
        cluster = resolver.cluster_spec().as_dict()
    except (RuntimeError, ValueError) as error:
        raise ConfigError(f"--cluster=slurm: {error}") from None
    task_type, index = resolver.get_task_info()
    hosts = [address.rpartition(":")[0] for address in cluster[task_type]]
    most = max(hosts.count(name) for name in hosts)
    if not port_base and most > PORTS_PER_JOB:
        raise ConfigError(
            f"--cluster=slurm: {most} tasks on a node need more than the {PORTS_PER_JOB} ports "
            "a job gets from SLURM_JOB_ID: give --cluster_port_base"
        )
    host = hosts[index]
    node = os.environ.get("SLURMD_NODENAME")
    if node and node != host:
        # The resolver sorts the hosts by name; SLURM numbers tasks in node order.
        raise ConfigError(
            f"--cluster=slurm: SlurmClusterResolver puts task {task} on {host}, but "
            f"SLURMD_NODENAME={node}: the nodes of SLURM_STEP_NODELIST="
            f"{os.environ['SLURM_STEP_NODELIST']} sorted by name are not in SLURM's task "
            "order; use srun --distribution=block and zero-padded node names, or write "
            "TF_CONFIG (--cluster=tf_config)"
        )
    return {"cluster": cluster, "task": {"type": task_type, "index": index}}


def _slurm_tf_task():
    """(SLURM_PROCID, SLURM_STEP_NUM_TASKS), each variable SlurmClusterResolver
    reads set and consistent (ConfigError names the first that is not)."""
    _require(SLURM_TF_VARIABLES)
    task, tasks = _slurm_integers("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")
    if task >= tasks:
        raise ConfigError(
            f"--cluster=slurm: SLURM_PROCID={task} is not in [0, SLURM_STEP_NUM_TASKS={tasks})"
        )
    _check_node_count("SLURM_STEP_NUM_TASKS", tasks)
    return task, tasks


def check_environment(config, backend):
    """The start's checks of the cluster's environment that need neither
    TensorFlow nor JAX (the tool runs them before either loads, so that a
    start outside srun ends at once, in the line the start would end with):
    --strategy=multi_worker's cluster and SLURM's variables for TensorFlow's
    resolver; on JAX (`backend`), --num_processes=0's detection of SLURM
    (runtime_jax.processes_of)."""
    if config.strategy == "multi_worker" and kind(config.cluster) == "slurm":
        _slurm_tf_task()
    detected = all(name in os.environ for name in SLURM_JAX_VARIABLES)
    if backend == "jax" and config.num_processes == 0 and detected:
        slurm_processes(flag=SLURM_DETECTED)


def slurm_processes(flag="--cluster=slurm"):
    """{coordinator_address, num_processes, process_id} of this SLURM task as
    jax.distributed.initialize detects them (see the module docstring).
    ConfigError (after `flag`) names a missing or invalid variable."""
    _require(SLURM_JAX_VARIABLES, flag)
    job, processes, process_id = _slurm_integers(
        "SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID", flag=flag
    )
    _slurm_integers("SLURM_LOCALID", flag=flag)
    nodes = os.environ["SLURM_STEP_NODELIST"]
    first = re.match(r"([^,\[]*)(?:\[([^,\-\]]*))?", nodes)  # "a[07-09],b" -> "a07"
    host = first.group(1) + (first.group(2) or "")
    if not host:
        raise ConfigError(f"{flag}: SLURM_STEP_NODELIST={nodes!r} names no host")
    if process_id >= processes:
        raise ConfigError(
            f"{flag}: SLURM_PROCID={process_id} is not in [0, SLURM_NTASKS={processes})"
        )
    _check_node_count("SLURM_NTASKS", processes, flag)
    port = os.environ.get("JAX_COORDINATOR_PORT") or str(61440 + job % 4096)
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(
            f"{flag}: JAX_COORDINATOR_PORT={port!r} (the coordinator's port under SLURM) is not "
            "a port, a whole number in [1, 65535]"
        )
    return {
        "coordinator_address": f"{host}:{port}",
        "num_processes": processes,
        "process_id": process_id,
    }


def node_count(nodes):
    """The number of hosts SLURM's hostlist `nodes` names ("n[01-04,07],m" ->
    6), counted without listing them; None if it is not one SLURM writes."""
    if not nodes.isascii() or nodes.count("[") != nodes.count("]"):
        return None
    count = 0
    for item in re.findall(r"(?:[^,\[\]]|\[[^\[\]]*\])+", nodes):
        size = 1
        for group in re.findall(r"\[([^\]]*)\]", item):
            hosts = 0
            for part in group.split(","):
                low, _, high = part.partition("-")
                high = high or low
                if not (low.isdigit() and high.isdigit() and int(low) <= int(high)):
                    return None
                hosts += int(high) - int(low) + 1
            size *= hosts
        count += size
    return count


def _check_node_count(variable, tasks, flag="--cluster=slurm"):
    """ConfigError if SLURM_STEP_NODELIST names more nodes than the step has
    tasks (each node of a step runs one at least), before anything lists them."""
    nodes = os.environ["SLURM_STEP_NODELIST"]
    count = node_count(nodes)
    if count is not None and count > tasks:
        raise ConfigError(
            f"{flag}: SLURM_STEP_NODELIST={nodes[:80]!r} names {count} nodes, more than the "
            f"{tasks} tasks of {variable}={tasks} (each node of a step runs one at least)"
        )


def _require(names, flag="--cluster=slurm"):
    missing = [name for name in names if not os.environ.get(name, "").strip()]
    if missing:
        raise ConfigError(
            f"{flag}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
            "set: run the tool as a task of srun (see docs/launchers.md)"
        )


def _slurm_integers(*names, flag="--cluster=slurm"):
    values = []
    for name in names:
        text = os.environ.get(name, "")
        if not (text.strip().isascii() and text.strip().isdigit()):
            raise ConfigError(f"{flag}: {name}={text!r} is not a whole number >= 0")
        values.append(int(text))
    return values
