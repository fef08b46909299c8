"""Step-time cost of measuring the gradient noise scale (keras_lars.noise_scale).

Trains two copies of one MLP with LARS side by side, one measuring the noise
scale (`noise_scale_batch_size`) and one not, alternating them round by round
so that the machine's noise hits both alike, and prints the median
milliseconds per training step (one micro-batch) and their ratio:

    measured / plain   the goal is <= 1.05 (one squared norm of the gradients
                       per micro-batch, one more per update, a scalar all-reduce)

Modes: "micro" (TensorFlow, one device, `gradient_accumulation_steps`),
"replicas" (TensorFlow MirroredStrategy over two logical CPUs, no
accumulation; the replicas' squared norms), "jax" (Keras's JAX backend in a
child process, micro-batches).

    python -m keras_lars.tools.benchmark_noise_scale [--rounds=20] [--modes=micro,replicas,jax]
"""

import dataclasses
import json
import os
import subprocess
import sys
import time

import keras
import numpy as np
from absl import app

import keras_lars
from keras_lars.tools import settings
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import setting

MODES = ("micro", "replicas", "jax")
GOAL = 1.05


@dataclasses.dataclass(frozen=True)
class NoiseScaleBenchmarkSettings:
    rounds: int = setting(20, "Timed rounds per variant and mode.", check=at_least(1))
    modes: tuple = setting(MODES, "Where the noise scale is measured.", choices=MODES)
    batch_size: int = setting(64, "Global batch of one step (one micro-batch).", check=at_least(2))
    width: int = setting(1024, "Units of the MLP's two hidden layers.", check=at_least(1))
    accumulation_steps: int = setting(
        4, "gradient_accumulation_steps of the micro and jax modes.", check=at_least(2)
    )

    def __post_init__(self):
        settings.check(self)


def make_step(options, measure, accumulate, strategy=None):
    """A function running `accumulation_steps` training steps (one applied
    update) of a fresh model, or one step without accumulation."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(options.batch_size, 784)).astype("float32")
    y = rng.integers(0, 10, size=(options.batch_size,)).astype("int32")
    extra = {"gradient_accumulation_steps": options.accumulation_steps} if accumulate else {}
    if measure:
        extra["noise_scale_batch_size"] = options.batch_size
    scope = strategy.scope() if strategy is not None else _Nothing()
    with scope:
        model = keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(options.width, activation="relu"),
                keras.layers.Dense(options.width, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        optimizer = keras_lars.LARS(0.1, momentum=0.9, weight_decay=1e-4, **extra)
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    steps = options.accumulation_steps if accumulate else 1

    def step():
        for _ in range(steps):
            model.train_on_batch(x, y)

    return step, steps


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def interleaved(steps, rounds):
    """{name: median ms per training step} of `steps` ({name: (function,
    training steps per call)}), each called once per round."""
    for function, _ in steps.values():  # trace, compile, warm up
        function()
        function()
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, (function, count) in steps.items():
            start = time.perf_counter()
            function()
            times[name].append((time.perf_counter() - start) / count)
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


def measure_mode(options, mode):
    """{"plain": ms, "measured": ms} of one mode in this process."""
    strategy = None
    if mode == "replicas":
        import tensorflow as tf

        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    accumulate = mode != "replicas"
    steps = {
        name: make_step(options, measure, accumulate, strategy)
        for name, measure in (("plain", False), ("measured", True))
    }
    return interleaved(steps, options.rounds)


def jax_child(options_json):
    """The "jax" mode, in a process whose KERAS_BACKEND is jax: prints JSON."""
    assert keras.backend.backend() == "jax", keras.backend.backend()
    fields = json.loads(options_json)
    options = NoiseScaleBenchmarkSettings(**dict(fields, modes=tuple(fields["modes"])))
    print(json.dumps(measure_mode(options, "jax")))


def measure_jax(options):
    code = (
        "import sys; from keras_lars.tools import benchmark_noise_scale as b; "
        "b.jax_child(sys.argv[1])"
    )
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    fields["modes"] = list(fields["modes"])
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, "-c", code, json.dumps(fields)], env=env, capture_output=True, text=True
    )
    if completed.returncode:
        raise RuntimeError(f"the JAX benchmark failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    options = settings.options_from_flags(NoiseScaleBenchmarkSettings)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    if "replicas" in options.modes:  # before TensorFlow initialises its devices
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
    parameters = 784 * options.width + options.width**2 + 10 * options.width
    print(
        f"MLP of {parameters:,} weights, batch {options.batch_size}, accumulation "
        f"{options.accumulation_steps} (micro, jax), TF {tf.__version__}, "
        f"Keras {keras.__version__}, {os.cpu_count()} CPUs"
    )
    for mode in options.modes:
        ms = measure_jax(options) if mode == "jax" else measure_mode(options, mode)
        ratio = ms["measured"] / ms["plain"]
        verdict = "ok" if ratio <= GOAL else "over goal"
        print(
            f"[{mode}] median ms per step: plain {ms['plain']:.2f}, measured "
            f"{ms['measured']:.2f}; measured / plain = {ratio:.3f}  (goal <= {GOAL}: {verdict})"
        )


def run(argv=None):
    settings.define_flags(NoiseScaleBenchmarkSettings)
    app.run(main, argv)


if __name__ == "__main__":
    run()
