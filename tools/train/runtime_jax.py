"""The training tool's runtime on Keras's JAX backend: processes, devices and
keras.distribution (the protocol: runtime.py).

    --distribution=none            one process, one device
    --distribution=data_parallel   a ("batch",) mesh of every device of every process;
                                   variables replicated
    --distribution=model_parallel  a ("batch", "model") mesh with --model_axis_size
                                   devices along "model" (within one process); each
                                   convolution wider than 1x1 shards its output
                                   channels, each dense kernel its input features over
                                   "model" (where the size divides), the rest is
                                   replicated

XLA partitions the compiled step (GSPMD): batch-norm statistics are those of
the global batch, and the optimizers' trust ratios use the norms of whole
variables, not of one device's shard.

Several processes (hosts of a pod) start through `jax.distributed.initialize`
(--coordinator_address, --num_processes, --process_id; --num_processes=0 lets
JAX detect them on Cloud TPU, SLURM or Open MPI). Process i of n reads input
pipeline i of n, as a worker under MultiWorkerMirroredStrategy does, and JAX
assembles each global batch from the processes' shares. A SIGTERM to any
process stops all of them at one step (JAX's preemption sync point).
"""

import contextlib
import dataclasses
import inspect
import os
import re
import types

import jax
import keras

from keras_lars import compat
from keras_lars import rendezvous
from keras_lars.tools import layout_file
from keras_lars.tools.input_pipeline.host import Batches
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.tensorflow_or_none import tf
from keras_lars.tools.train import cluster
from keras_lars.tools.train.preemption import NoClusterPreemption
from keras_lars.tools.train.preemption import Preempted
from keras_lars.tools.train.process_start import bounded_start
from keras_lars.tools.train.process_start import shared_settings


class JaxRuntime:
    """--distribution over the devices of jax.distributed's processes."""

    def __init__(self, config):
        self.config, self.strategy = config, None
        self.flag = f"--distribution={config.distribution}"
        self.single_process = config.num_processes == 1
        if config.precision == "float64":  # before any array of the run
            jax.config.update("jax_enable_x64", True)

    def start(self, preemption):
        """Checks that this Keras runs --distribution as one device would, meets
        the other processes (interruptible), then joins jax.distributed."""
        if self.config.distribution != "none":
            parallelism = self.config.distribution.split("_")[0]  # "data" or "model"
            problem = compat.distribution_problem(parallelism, self.config.num_processes)
            if problem:
                raise ConfigError(f"{self.flag}: {problem}.")
            without_a_hanging_cache()
        processes = processes_of(self.config)
        try:
            with preemption.handling(action="stopping the wait for the other processes"):
                meet_processes(self.config, stop=lambda: preemption.signal, processes=processes)
                if preemption.signal:  # received as the wait ended
                    raise InterruptedError(f"stopped by {preemption.signal} as the processes met")
        except InterruptedError as error:
            raise Preempted(f"{error}; nothing was trained; run the same command") from None
        start_processes(self.config, processes)
        self.single_process = jax.process_count() == 1

    def place(self, variable_shapes):
        self.strategy = make_devices(self.config, variable_shapes)
        self.description = self.strategy.description
        print(f"{self.flag}: {self.description}", flush=True)

    def cluster_preemption(self, save, stop):
        return NoClusterPreemption() if self.single_process else _SyncPoint(stop)

    @staticmethod
    def collective_failed(error, values):
        """A JAX runtime error of a run in several processes: a collective
        across them failed (most likely, another process died)."""
        return isinstance(error, jax.errors.JaxRuntimeError) and jax.process_count() > 1


# jax below 0.6 hangs running a multi-device step it loaded from its persistent
# compilation cache: measured 2026-12-04 (jax 0.5.3, Keras 3.15.1, TF 2.17.1), the
# tool's data-parallel run on 8 CPU devices filled an empty cache in 28 s, and the
# rerun that loaded it hung (main thread in XLA's TfrtCpuBuffer::Delete, deaf to
# SIGTERM); without a cache 14 s. One-device runs loaded it without a hang.
CACHE_SAFE_SINCE = (0, 6)


def without_a_hanging_cache():
    """Turns the persistent compilation cache off (one line) for a run on
    several devices where jax predates CACHE_SAFE_SINCE."""
    directory = jax.config.jax_compilation_cache_dir
    version = compat.installed_version("jax")
    if directory and jax.config.jax_enable_compilation_cache and version < CACHE_SAFE_SINCE:
        jax.config.update("jax_enable_compilation_cache", False)
        print(
            f"warning: jax {compat.dotted(version)} can hang running a multi-device step "
            f"it loaded from its persistent compilation cache: this run does not use "
            f"{directory} (JAX_COMPILATION_CACHE_DIR); jax >= "
            f"{compat.dotted(CACHE_SAFE_SINCE)} does",
            flush=True,
        )


class _SyncPoint:
    """A SIGTERM to any process makes every process stop at one step (JAX's
    preemption sync point, jax.distributed's notifier)."""

    def __init__(self, stop):
        self._stop, self._stopped = stop, False

    def at_step(self, step, done):
        from jax.experimental import multihost_utils

        if not self._stopped and multihost_utils.reached_preemption_sync_point(step):
            self._stopped = True
            self._stop()


def processes_of(config):
    """{coordinator_address, num_processes, process_id} of the run's
    processes: the flags', or with --num_processes=0 what JAX's own cluster
    detection finds (SLURM: `cluster.slurm_processes`, whose checks name the
    variables; other clusters: JAX's detection itself), so that the processes
    meet, and their settings are compared, before jax.distributed starts; {}
    where there is no cluster to detect (JAX's start then says so)."""
    if config.num_processes != 0:
        return {
            "coordinator_address": config.coordinator_address,
            "num_processes": config.num_processes,
            "process_id": config.process_id,
        }
    if all(name in os.environ for name in cluster.SLURM_JAX_VARIABLES):
        return cluster.slurm_processes(flag=cluster.SLURM_DETECTED)
    try:
        from jax._src.clusters import ClusterEnv

        found = ClusterEnv.auto_detect_unset_distributed_params(
            None, None, None, None, None, int(60 * config.worker_start_timeout_minutes)
        )
    except Exception:  # another jax's private API, or a cluster that cannot answer
        return {}
    address, count, index = found[:3]
    if address is None or count is None or index is None:
        return {}
    return {"coordinator_address": address, "num_processes": count, "process_id": index}


def meet_processes(config, stop=lambda: False, processes=None):
    """Waits until every process of the run (`processes_of`, when more than
    one) has started (a ConfigError naming the flags at
    --worker_start_timeout_minutes): jax.distributed aborts the process, with
    no exception, when one is missing at its deadline. `stop()` true ends the
    wait (InterruptedError)."""
    processes = processes_of(config) if processes is None else processes
    if processes.get("num_processes", 1) <= 1:
        return
    address = processes["coordinator_address"]
    flags = f"--num_processes={processes['num_processes']} --process_id={processes['process_id']}"
    if config.num_processes == 0:
        flags = f"--num_processes=0 (detected: {flags} --coordinator_address={address})"
    try:
        wait_for_processes(
            address,
            processes["num_processes"],
            processes["process_id"],
            60 * config.worker_start_timeout_minutes,
            log=lambda line: print(line, flush=True),
            stop=stop,
            settings=shared_settings(config),
            secret_dir=config.model_dir,
        )
    except rendezvous.HandshakeError as error:
        raise ConfigError(f"{flags}: {error}") from None
    except InterruptedError:  # stop(), an OSError too: JaxRuntime.start says preempted (75)
        raise
    except TimeoutError as error:
        raise ConfigError(
            f"--coordinator_address={address} {flags}: cannot join the other processes within "
            f"--worker_start_timeout_minutes={config.worker_start_timeout_minutes:g}: {error}"
        ) from None
    except (OSError, ValueError) as error:  # a malformed address, or one this host cannot hold
        raise ConfigError(f"--coordinator_address={address} {flags}: {error}") from None


def start_processes(config, processes=None):
    """Joins the processes of the run (jax.distributed; after
    `meet_processes`) unless it has one. Call before anything touches a JAX
    device. From here on, SIGTERM belongs to JAX's preemption notifier."""
    processes = processes_of(config) if processes is None else processes
    # tf.data is the input pipeline where installed: keep TensorFlow off the accelerators.
    with contextlib.suppress(RuntimeError, AttributeError):  # started already; or no tf
        tf.config.set_visible_devices([], "GPU")
    if config.num_processes == 1:
        return
    # JAX aborts the process at its own deadline: bounded_start's comes first.
    timeout = int(60 * config.worker_start_timeout_minutes) + 30
    arguments = {"initialization_timeout": timeout, **processes}  # those the processes met with
    try:
        with bounded_start(config, "jax.distributed", "processes", "a process"):
            jax.distributed.initialize(**arguments)
    except ValueError as error:
        if config.num_processes != 0:
            raise
        missed = next((what for key, what in _UNDETECTED if key in str(error)), str(error))
        raise ConfigError(
            f"--num_processes=0: JAX detected no cluster here (no Cloud TPU, SLURM or Open MPI "
            f"environment gave {missed}); give --num_processes, --coordinator_address and "
            "--process_id, or --num_processes=1 for one process."
        ) from None


# jax.distributed.initialize's errors for what its cluster detection left unset.
_UNDETECTED = (
    ("coordinator_address", "the coordinator's address"),
    ("Number of processes", "the number of processes"),
    ("process id", "this process's id"),
)


def wait_for_processes(
    address,
    processes,
    process_id,
    timeout_seconds,
    log,
    stop=lambda: None,
    settings=None,
    secret_dir=None,
):
    """Returns once all `processes` have started with the same `settings`
    ({name: value}), before jax.distributed starts: the handshake of
    keras_lars.rendezvous, process 0 listening on `address` (host:port, the
    coordinator's). Logs who is missing every 30 s; TimeoutError names them;
    InterruptedError once `stop()` gives a reason; HandshakeError names the
    settings that differ. `secret_dir`: where process 0 writes this start's
    secret (keras_lars.rendezvous) unless $KERAS_LARS_RUN_SECRET is set."""
    tasks = {("process", index): f"process {index}" for index in range(processes)}
    tasks["process", 0] = f"process 0 at {address}"
    rendezvous.meet(
        ("process", process_id),
        tasks,
        address,
        timeout_seconds,
        run={"coordinator": address},  # the number of processes is a setting
        settings=settings,
        others="other processes",
        log=log,
        stop=stop,
        secret_dir=secret_dir,
    )


class Devices:
    """keras.distribution set up for the tool, behind the few members of
    tf.distribute.Strategy the tool uses: `scope()`, `num_replicas_in_sync`
    (the ways the global batch is split), `extended.should_checkpoint` (process
    0 writes) and `distribute_datasets_from_function` (this process's input
    pipeline; its batches are this process's share of each global batch)."""

    def __init__(self, distribution, batch_ways, description):
        self.distribution, self.description = distribution, description
        self.num_replicas_in_sync = batch_ways
        self.processes = jax.process_count()
        self.extended = types.SimpleNamespace(should_checkpoint=jax.process_index() == 0)

    def scope(self):
        return contextlib.nullcontext()

    def distribute_datasets_from_function(self, dataset_fn):
        processes = jax.process_count()
        made = dataset_fn(InputContext(processes, jax.process_index(), processes))
        return _forever(made) if isinstance(made, Batches) else made


@dataclasses.dataclass(frozen=True)
class InputContext:
    """What the input pipelines read of tf.distribute.InputContext: process
    i of n reads pipeline i of n, its share of each global batch."""

    num_input_pipelines: int
    input_pipeline_id: int
    num_replicas_in_sync: int

    def get_per_replica_batch_size(self, global_batch_size):
        return global_batch_size // self.num_replicas_in_sync


def _forever(batches):
    """host.py's numpy batches as Keras takes them, a generator, over and over:
    Keras reads the steps it is given from one iterator (an evaluation set
    again at every evaluation)."""
    while True:
        yield from batches


def make_devices(config, variable_shapes):
    """Sets the keras.distribution of --distribution over every device of
    every process and returns its Devices. `variable_shapes()` ({path: shape}
    of the model's variables) places model_parallel's shards."""
    devices, processes = jax.devices(), jax.process_count()
    keras.distribution.set_distribution(None)
    if config.distribution == "none":
        if processes > 1:
            raise ConfigError(
                f"--num_processes={processes} needs --distribution=data_parallel or model_parallel."
            )
        return Devices(None, 1, f"one device ({devices[0].platform})")
    if config.distribution == "data_parallel":
        mesh = keras.distribution.DeviceMesh((len(devices),), ["batch"], devices)
        distribution = keras.distribution.DataParallel(device_mesh=mesh, auto_shard_dataset=False)
        keras.distribution.set_distribution(distribution)
        return Devices(distribution, len(devices), _describe(devices, "batch"))
    size, local = config.model_axis_size, jax.local_device_count()
    if processes > 1:
        # Keras saves a variable through numpy, which a variable sharded over
        # devices of several processes cannot give.
        raise ConfigError(
            f"--distribution=model_parallel runs in one process (--num_processes={processes}); "
            "use --distribution=data_parallel across processes."
        )
    if local % size and not config.layout:
        raise ConfigError(
            f"--model_axis_size={size} must divide the {local} devices of the process."
        )
    shapes = variable_shapes()
    if config.layout:
        (batch, size), layouts = planned_layouts(config.layout, shapes, len(devices))
    else:
        batch, layouts = len(devices) // size, layout_file.model_parallel_layouts(shapes, size)
        layouts = {re.escape(path): layout for path, layout in layouts.items()}
    mesh = keras.distribution.DeviceMesh((batch, size), ["batch", "model"], devices)
    arguments = {
        "layout_map": layout_map(mesh, layouts),
        "batch_dim_name": "batch",
        "auto_shard_dataset": False,
    }
    if "device_mesh" in inspect.signature(keras.distribution.ModelParallel).parameters:
        arguments["device_mesh"] = mesh  # Keras < 3.11
    distribution = keras.distribution.ModelParallel(**arguments)
    keras.distribution.set_distribution(distribution)
    sharded = sum(any(re.fullmatch(p, path) for p in layouts) for path in shapes)
    sharded = f"{sharded} of {len(shapes)} variables sharded over model"
    if config.layout:
        sharded += f" (--layout={config.layout})"
    return Devices(
        distribution, batch, _describe(devices, f"batch {batch} x model {size}", sharded)
    )


def layout_map(mesh, layouts):
    """keras.distribution.LayoutMap of {regex: axes}, each regex anchored
    (\\A(?:regex)\\Z) so that a variable path takes a layout when re.fullmatch
    matches, as layout_file.py and the planner mean: Keras 3.14 on looks a path
    up with re.fullmatch, Keras up to 3.13 with re.search, where "conv1/kernel"
    also matches "stage1_block1_conv1/kernel" (on Keras 3.10, ResNet-50's
    --distribution=model_parallel sharded 34 kernels, not the 18 planned, and
    its compiled step moved 3.1x the planned bytes; 2026-12-04)."""
    mapped = keras.distribution.LayoutMap(mesh)
    for pattern, layout in layouts.items():
        mapped[rf"\A(?:{pattern})\Z"] = layout
    return mapped


def planned_layouts(path, shapes, devices):
    """((batch, model), {regex: axes}) of the layout file at `path` (one
    ConfigError line naming the file when it does not fit the model or the
    devices, or when this Keras cannot run it)."""
    problem = compat.distribution_problem("model")
    if problem:
        raise ConfigError(f"--layout={path}: {problem}.")
    try:
        return layout_file.read(path, shapes, devices)
    except ValueError as error:
        raise ConfigError(f"--layout={path}: {error}.") from None


def _describe(devices, mesh, *more):
    processes = jax.process_count()
    where = f" in {processes} processes" if processes > 1 else ""
    parts = [f"{len(devices)} {devices[0].platform} devices{where}", f"mesh {mesh}", *more]
    return ", ".join(parts)
