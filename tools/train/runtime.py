"""Where the run executes: one protocol, a TensorFlow and a JAX implementation.

The rest of the tool talks to a runtime and never asks which backend it is on:

    runtime = runtime_class(config.backend)(config)
    runtime.start(preemption)        # joins the other workers/processes
    runtime.place(variable_shapes)   # devices ready (JAX: the mesh and layouts)
    runtime.strategy                 # tf.distribute.Strategy's scope(),
                                     # num_replicas_in_sync, extended.should_checkpoint,
                                     # distribute_datasets_from_function
    runtime.flag                     # the setting that chose it, for messages
    runtime.single_process           # a signal to this process alone may stop the run
    runtime.cluster_preemption(save, stop)  # per step: all processes stop at one step
    runtime_class(backend).collective_failed(error, values)  # a peer was lost

TensorFlowRuntime is --strategy (keras_lars.make_strategy); JaxRuntime
(runtime_jax.py) is --distribution over jax.distributed's processes.
"""

import tempfile

import keras_lars
from keras_lars.tools import storage
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train import cluster
from keras_lars.tools.train.preemption import NoClusterPreemption
from keras_lars.tools.train.preemption import Preempted
from keras_lars.tools.train.process_start import bounded_start
from keras_lars.tools.train.process_start import shared_settings


def runtime_class(backend):
    """The runtime of Keras's backend `backend` ("tensorflow" or "jax")."""
    if backend == "jax":
        from keras_lars.tools.train.runtime_jax import JaxRuntime  # imports jax

        return JaxRuntime
    return TensorFlowRuntime


class TensorFlowRuntime:
    """--strategy: one device, the local GPUs, the cluster of TF_CONFIG or a TPU."""

    def __init__(self, config):
        self.config, self.strategy = config, None
        self.flag = f"--strategy={config.strategy}"
        self.single_process = config.strategy != "multi_worker"

    def start(self, preemption):
        if self.config.strategy == "multi_worker":
            cluster.export_tf_config(self.config, log=lambda line: print(line, flush=True))
            _wait_for_workers(self.config, preemption)
        if self.config.strategy == "multi_worker":
            with bounded_start(self.config, "TensorFlow", "workers", "a worker"):
                self.strategy = strategy_of_flags(self.config)
        else:
            self.strategy = strategy_of_flags(self.config)
        self.description = f"{self.strategy.num_replicas_in_sync} replicas"

    def place(self, variable_shapes):
        """The strategy places the variables itself."""

    def cluster_preemption(self, save, stop):
        """Under multi_worker, a SIGTERM to any worker makes every worker save
        at the same step (tf.distribute.experimental.PreemptionCheckpointHandler
        agrees on it through the coordination service): `save()` writes our
        checkpoint, `stop()` ends the run at this step boundary."""
        if self.single_process:
            return NoClusterPreemption()
        return _ClusterPreemption(self.strategy, save, stop)

    @staticmethod
    def collective_failed(error, values):
        """Under --strategy=multi_worker, a collective's Unavailable or Aborted."""
        import tensorflow as tf

        collective = (tf.errors.UnavailableError, tf.errors.AbortedError)
        return values["strategy"] == "multi_worker" and isinstance(error, collective)


class _ClusterPreemption:
    def __init__(self, strategy, save, stop):
        import tensorflow as tf

        self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            strategy.cluster_resolver,
            tf.train.Checkpoint(),  # restores only its own counter; nothing saved
            checkpoint_dir=tempfile.mkdtemp(prefix="keras_lars_preemption_"),
            termination_config=tf.distribute.experimental.TerminationConfig(
                exit_fn=stop, save_fn=save
            ),
        )

    def at_step(self, step, done):
        self._handler.save_checkpoint_if_preempted()


def _wait_for_workers(config, preemption):
    """Waits for the other tasks of TF_CONFIG, interruptible (TensorFlow's own
    wait, in the strategy's start, is neither logged nor interruptible)."""
    try:
        with preemption.handling(action="stopping the wait for the other workers"):
            keras_lars.distribute.wait_for_workers(
                60 * config.worker_start_timeout_minutes,
                log=lambda line: print(line, flush=True),
                stop=lambda: preemption.signal,
                settings=shared_settings(config),
                secret_dir=config.model_dir,
            )
            if preemption.signal:  # received as the wait ended
                raise InterruptedError(f"stopped by {preemption.signal} as the workers met")
    except ValueError as error:  # TF_CONFIG, or the workers' settings differ
        raise ConfigError(f"--strategy=multi_worker: {error}") from None
    except InterruptedError as error:
        raise Preempted(f"{error}; nothing was trained; run the same command to start") from None
    except TimeoutError as error:
        raise ConfigError(
            f"--worker_start_timeout_minutes={config.worker_start_timeout_minutes:g}: {error}"
        ) from None
    except OSError as error:  # this task's own address is taken
        raise ConfigError(f"--strategy=multi_worker: {error}") from None


def strategy_of_flags(config):
    """The strategy of --strategy (and --tpu), built by keras_lars.make_strategy,
    with the compat workarounds this run needs."""
    import tensorflow as tf  # on this backend only: a JAX-only install has none

    try:
        strategy = keras_lars.make_strategy(config.strategy, tpu_address=config.tpu)
    except (ValueError, keras_lars.compat.UnsupportedVersionError) as error:
        raise ConfigError(f"--strategy={config.strategy}: {error}") from None
    except (RuntimeError, tf.errors.OpError) as error:  # e.g. no TPU at --tpu
        where = f" --tpu={config.tpu}" if config.strategy == "tpu" else ""
        raise ConfigError(
            f"--strategy={config.strategy}{where}: cannot start it: {storage.first_line(error)}"
        ) from None
    replicas = strategy.num_replicas_in_sync
    needs = []
    if strategy is not tf.distribute.get_strategy():  # its input is distributed
        needs.append(("distributed_datasets_from_function", f"--strategy={config.strategy}"))
    if replicas > 1:
        needs.append(("on_read_metric_variables", f"--strategy={config.strategy}"))
    if replicas > 1 and config.steps_per_execution > 1:
        needs.append(
            ("steps_per_execution_loop", f"--steps_per_execution={config.steps_per_execution}")
        )
    if replicas > 1 and not config.sync_batch_norm:
        needs.append(("mean_batch_norm_statistics", "--nosync_batch_norm"))
    if config.sync_batch_norm:  # one replica's synchronized statistics too
        keras_lars.compat.apply(["sync_batch_norm_variance"])
        needs.append(("sync_batch_norm_variance", "--sync_batch_norm"))
    for name, flag in needs:
        try:
            keras_lars.compat.require(name, f"{flag} under {replicas} replicas")
        except keras_lars.compat.UnsupportedVersionError as error:
            raise ConfigError(str(error)) from None
    return strategy
