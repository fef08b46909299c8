"""Distribution strategies for large-batch training (TensorFlow backend).

    strategy = keras_lars.distribute.make_strategy("auto")
    with strategy.scope():
        model = ...; model.compile(optimizer=keras_lars.LARS(...), ...)
    model.fit(dataset, callbacks=[keras_lars.distribute.BackupAndRestore(dir)])

`make_strategy` builds a TPUStrategy, MultiWorkerMirroredStrategy (from
TF_CONFIG), MirroredStrategy, OneDeviceStrategy or the default strategy,
and installs `keras_lars.compat` for the TPU, Mirrored and
MultiWorkerMirrored strategies (each workaround acts only where its bug is).
`all_reduce_in` sums the replicas' gradients in bfloat16 or float16 (the
`allreduce_dtype` of LARS and LAMB).
`BackupAndRestore` is Keras's fault-tolerance callback made chief-aware, so
workers of one job do not write the same files.
"""

import json
import os
import shutil
import tempfile

import keras

from keras_lars import compat
from keras_lars import rendezvous

KINDS = ("auto", "tpu", "multi_worker", "mirrored", "one_device", "default")
COLLECTIVE_IMPLEMENTATIONS = ("auto", "ring", "nccl")


def _tf():
    try:
        import tensorflow as tf
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError(
            "keras_lars.distribute needs TensorFlow; install one distribution "
            'of it, e.g. pip install "keras-lars[cpu]" (or [tensorflow], [tpu]).'
        ) from error
    return tf


def parse_tf_config(text=None, variable="TF_CONFIG"):
    """Parses and validates a TF_CONFIG JSON string (default: the variable).

    Expected shape, e.g. worker 0 of two:
        {"cluster": {"worker": ["host1:12345", "host2:12345"]},
         "task": {"type": "worker", "index": 0}}
    Returns the parsed dict. Raises ValueError naming `variable` and the
    offending field for a missing variable, bad JSON, a missing or malformed
    `cluster` or `task`, an address named twice, an unknown task type or an
    index out of range.
    """
    if text is None:
        text = os.environ.get(variable)
    if text is None or not text.strip():
        raise ValueError(
            f"{variable} is not set: multi-worker training needs it, e.g. "
            f'{variable}=\'{{"cluster": {{"worker": ["host1:port", "host2:port"]}}, '
            f'"task": {{"type": "worker", "index": 0}}}}\'.'
        )
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{variable} is not valid JSON ({error}): {text!r}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{variable} must be a JSON object, received {text!r}.")

    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(
            f"{variable}['cluster'] must be a non-empty object mapping job names "
            f"to lists of 'host:port' addresses, received {cluster!r}."
        )
    for job, addresses in cluster.items():
        if (
            not isinstance(addresses, list)
            or not addresses
            or not all(isinstance(a, str) and a.rpartition(":")[2].isdigit() for a in addresses)
        ):
            raise ValueError(
                f"{variable}['cluster']['{job}'] must be a non-empty list of "
                f"'host:port' strings, received {addresses!r}."
            )
    seen = {}
    for job, addresses in cluster.items():
        for index, address in enumerate(addresses):
            if address in seen:
                raise ValueError(
                    f"{variable}['cluster'] names {address} twice ({seen[address]} and "
                    f"{job} {index}): each task listens on an address of its own."
                )
            seen[address] = f"{job} {index}"

    task = config.get("task")
    if not isinstance(task, dict):
        raise ValueError(
            f"{variable}['task'] must be an object like "
            f'{{"type": "worker", "index": 0}}, received {task!r}.'
        )
    task_type, index = task.get("type"), task.get("index")
    if task_type not in cluster:
        raise ValueError(
            f"{variable}['task']['type'] = {task_type!r} is not a job of "
            f"{variable}['cluster'] ({sorted(cluster)})."
        )
    if not isinstance(index, int) or isinstance(index, bool):
        raise ValueError(f"{variable}['task']['index'] must be an integer, received {index!r}.")
    if not 0 <= index < len(cluster[task_type]):
        raise ValueError(
            f"{variable}['task']['index'] = {index} is out of range for job "
            f"'{task_type}' with {len(cluster[task_type])} task(s)."
        )
    return config


def make_strategy(
    kind="auto",
    tpu_address=None,
    devices=None,
    collective_implementation="auto",
    bytes_per_pack=0,
    timeout_seconds=None,
    apply_compat=True,
    behaviour_changes=True,
):
    """Returns a `tf.distribute.Strategy`.

    Args:
        kind: one of `KINDS`:
            "tpu": TPUStrategy on the TPU at `tpu_address` (a name, a
                grpc:// address or "local" on a TPU VM; None reads the
                TPU_NAME environment variable / the GCE metadata).
            "multi_worker": MultiWorkerMirroredStrategy on the cluster of
                TF_CONFIG (validated by `parse_tf_config`).
            "mirrored": MirroredStrategy over `devices` (default: all GPUs,
                else the CPU).
            "one_device": OneDeviceStrategy on `devices[0]` (default: the
                first GPU, else the CPU).
            "default": TensorFlow's default (no-op) strategy.
            "auto": "tpu" if `tpu_address` or TPU_NAME is set, else
                "multi_worker" if TF_CONFIG is set, else "mirrored" with
                several GPUs, else "default".
        tpu_address: see "tpu".
        devices: list of device names for "mirrored" / "one_device".
        collective_implementation: "auto", "ring" (gRPC ring all-reduce)
            or "nccl" (GPUs) for "multi_worker".
        bytes_per_pack: int >= 0; "multi_worker" packs gradients into
            all-reduce chunks of about this size (0: TensorFlow's choice).
        timeout_seconds: None or > 0, timeout of each collective.
        apply_compat: install `keras_lars.compat.apply()` for "tpu",
            "mirrored" and "multi_worker" (see that module for what it
            fixes; each workaround acts only on the strategies it concerns).
            "multi_worker" then raises `compat.UnsupportedVersionError` if
            the fixes its `fit` needs cannot be installed on these versions.
        behaviour_changes: False installs compat's crash fixes only, not
            those that change numbers (batch-norm statistics and metric
            states under several replicas, the step count at the end of a
            dataset). Clipping after the all-reduce is no workaround but
            what LARS and LAMB do.
    """
    if kind not in KINDS:
        raise ValueError(f"Unknown strategy `kind` {kind!r}; expected one of {KINDS}.")
    if collective_implementation not in COLLECTIVE_IMPLEMENTATIONS:
        raise ValueError(
            f"`collective_implementation` must be one of {COLLECTIVE_IMPLEMENTATIONS}, "
            f"received {collective_implementation!r}."
        )
    if (
        not isinstance(bytes_per_pack, int)
        or isinstance(bytes_per_pack, bool)
        or bytes_per_pack < 0
    ):
        raise ValueError(f"`bytes_per_pack` must be an integer >= 0, received {bytes_per_pack!r}.")
    if timeout_seconds is not None and not timeout_seconds > 0:
        raise ValueError(f"`timeout_seconds` must be None or > 0, received {timeout_seconds!r}.")
    tf = _tf()

    if kind == "auto":
        if tpu_address or os.environ.get("TPU_NAME"):
            kind = "tpu"
        elif os.environ.get("TF_CONFIG"):
            kind = "multi_worker"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            kind = "mirrored"
        else:
            kind = "default"

    if kind == "tpu":
        strategy = _tpu_strategy(tf, tpu_address)
        if apply_compat:
            compat.apply(behaviour_changes=behaviour_changes)
        return strategy
    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "one_device":
        if devices:
            device = devices[0]
        else:
            device = "/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"
        return tf.distribute.OneDeviceStrategy(device)

    if kind == "mirrored":
        if apply_compat:
            compat.apply(behaviour_changes=behaviour_changes)
        return tf.distribute.MirroredStrategy(devices)
    parse_tf_config()
    if apply_compat:
        compat.apply(behaviour_changes=behaviour_changes)
        for name in ("symbolic_build_batch", "multi_worker_metrics"):
            compat.require(name, "model.fit under MultiWorkerMirroredStrategy")
    implementation = getattr(
        tf.distribute.experimental.CommunicationImplementation, collective_implementation.upper()
    )
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack,
        timeout_seconds=timeout_seconds,
        implementation=implementation,
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _finite_max_abs(tf, g):
    """max |g| over the finite entries of `g` (0 if none), in float32."""
    g = tf.abs(tf.cast(g, "float32"))
    return tf.reduce_max(tf.where(tf.math.is_finite(g), g, tf.zeros_like(g)))


def all_reduce_in(dtype, all_reduce_sum, grads_and_vars):
    """`all_reduce_sum(grads_and_vars)`, the replicas' gradient sum, taken in
    `dtype` ("bfloat16" or "float16"; Jia et al. 2018): each replica casts
    g_r to `dtype`, the collective sums, the sum is cast back to g's dtype.
    For float16 each gradient i is first scaled by a power of two, from one
    small all-reduce of B_i = sum_r max|g_r,i|:

        s_i = 2^floor(log2(2^14 / B_i))  (1 where B_i = 0)
        g_i = (sum_r s_i * g_r,i) / s_i

    No partial sum can overflow, small gradients keep their digits, and the
    unscaling is exact. B_i counts finite entries only, so an inf or NaN
    entry stays in its place, as in float32 (inf + 1 = inf, inf - inf = NaN),
    and the others keep their values. Call it in a replica context
    (`LayerwiseOptimizer` does, for `allreduce_dtype`)."""
    tf = _tf()
    pairs = [(g if g is None else tf.convert_to_tensor(g), v) for g, v in grads_and_vars]
    present = [g for g, _ in pairs if g is not None]
    scales = [None] * len(present)
    if dtype == "float16" and present:
        bounds = tf.stack([_finite_max_abs(tf, g) for g in present])
        context = tf.distribute.get_replica_context()
        bounds = context.all_reduce(tf.distribute.ReduceOp.SUM, bounds)
        exponents = tf.floor(tf.math.log(2.0**14 / bounds) / tf.math.log(2.0))
        exponents = tf.where(bounds > 0, exponents, tf.zeros_like(exponents))
        scales = tf.unstack(tf.pow(2.0, exponents))
    low, found = [], iter(zip(present, scales))
    for g, v in pairs:
        if g is not None:
            g, scale = next(found)
            g = tf.cast(g, "float32") if scale is None else tf.cast(g, "float32") * scale
            g = tf.cast(g, dtype)
        low.append((g, v))
    reduced, found = all_reduce_sum(low), iter(scales)
    result = []
    for (g, v), (original, _) in zip(reduced, pairs):
        if g is not None:
            scale = next(found)
            g = tf.cast(g, "float32") if scale is None else tf.cast(g, "float32") / scale
            g = tf.cast(g, original.dtype)
        result.append((g, v))
    return result


def wait_for_workers(
    timeout_seconds,
    log=print,
    report_every_seconds=30.0,
    stop=None,
    settings=None,
    secret_dir=None,
):
    """Waits until every chief/worker task of TF_CONFIG has started and shares
    `settings`: the start-up handshake of `keras_lars.rendezvous`.

    MultiWorkerMirroredStrategy's start waits for its peers inside TensorFlow,
    silently, forever, deaf to SIGINT and SIGTERM, and takes any program
    listening on a peer's address for the peer. Call this first: the chief
    (the "chief" task, else worker 0) listens on its TF_CONFIG address and
    admits each other task that proves, answering a challenge, that it holds
    the run's secret: $KERAS_LARS_RUN_SECRET if set, else one the chief
    writes for this start into `secret_dir` (owner-only), which every task
    reads; without either the start is not authenticated (one warning line).
    The others reserve their own address and meet the chief; settings are
    compared only among tasks that proved themselves. Every
    `report_every_seconds` it logs which tasks are missing; it stays
    interruptible. Then TensorFlow's servers start on the
    same ports.

    Args:
        timeout_seconds: float > 0: raise TimeoutError after that long.
        log: called with each "waiting for ..." line and each ignored
            connection.
        report_every_seconds: float > 0, the interval of those lines.
        stop: None or a callable returning a reason (e.g. a signal name) to
            give up: then InterruptedError.
        settings: None or {name: value} (JSON-able) every task must share:
            else `keras_lars.rendezvous.HandshakeError` (a ValueError) naming
            the settings that differ and which task holds which value.
        secret_dir: None or a directory every task reads (a path or a
            gs:// URL): where the chief writes this start's secret.
    Returns the number of tasks waited for (0 for a cluster of one). Raises
    OSError naming this task's address if another program holds it.
    """
    config = parse_tf_config()
    cluster, task = config["cluster"], config["task"]
    jobs = {job: cluster[job] for job in ("chief", "worker") if cluster.get(job)}
    addresses = {
        (job, i): address for job, hosts in jobs.items() for i, address in enumerate(hosts)
    }
    me = (task["type"], task["index"])
    if me not in addresses:  # e.g. an evaluator: it joins no collective
        return 0
    return rendezvous.meet(
        me,
        {t: f"{t[0]} {t[1]} ({address})" for t, address in addresses.items()},
        next(iter(addresses.values())),  # the chief's, else worker 0's
        timeout_seconds,
        run={"cluster": jobs},
        settings=settings,
        own_address=addresses[me],
        addresses=addresses,
        others="other tasks of TF_CONFIG",
        log=log,
        report_every_seconds=report_every_seconds,
        stop=stop,
        secret_dir=secret_dir,
    )


def _tpu_strategy(tf, tpu_address):
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_address)
    except (ValueError, OSError) as error:
        raise ValueError(
            f"Cannot find a TPU from `tpu_address`={tpu_address!r} (None reads "
            f"TPU_NAME, set to {os.environ.get('TPU_NAME')!r}): {error}"
        ) from error
    if tpu_address != "local":
        tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy=None):
    """Whether this process writes shared files (checkpoints, logs): the
    chief of a multi-worker cluster, or any single-process strategy."""
    strategy = strategy or _tf().distribute.get_strategy()
    try:
        return bool(strategy.extended.should_checkpoint)
    except (AttributeError, NotImplementedError):
        return True


def save_on_chief(save, directory, strategy=None):
    """Calls save(directory) on the chief and save(scratch) on every other
    worker, where scratch is a private temporary directory removed right
    after: all workers save (as they must if saving ever needs collective
    ops), only the chief's files are kept."""
    if is_chief(strategy):
        return save(directory)
    scratch = tempfile.mkdtemp(prefix="keras_lars_scratch_")
    try:
        return save(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@keras.saving.register_keras_serializable(package="keras_lars")
class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` that is safe with several workers.

    Keras 3's callback has every worker write (and finally delete) the same
    files in `backup_dir`. Here only the chief writes `backup_dir`; the
    other workers write their backup to a private temporary directory that
    is removed right away, and every worker restores from `backup_dir`,
    which must therefore be on storage all workers read (a shared file
    system or a bucket). Restarted workers resume at the epoch after the
    last backup, with the weights, optimizer state and step count of then.
    Same arguments as Keras's callback.
    """

    def _save_model(self):
        def save(directory):
            if directory == self.backup_dir:
                super(BackupAndRestore, self)._save_model()
            else:
                self.model.save_weights(os.path.join(directory, "latest.weights.h5"))

        save_on_chief(save, self.backup_dir, self.model.distribute_strategy)

    def on_train_end(self, logs=None):
        if is_chief(self.model.distribute_strategy):
            super().on_train_end(logs)

    def get_config(self):
        return {
            "backup_dir": self.backup_dir,
            "save_freq": self.save_freq,
            "double_checkpoint": self.double_checkpoint,
            "delete_checkpoint": self.delete_checkpoint,
        }
