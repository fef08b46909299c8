"""Apply-time benchmark of LARS and LAMB against Keras's own optimizers.

Builds variables with ResNet-50's shapes (25.6M parameters), then times one
`optimizer.apply(gradients, variables)` per optimizer, in TF graph mode and
compiled with XLA, interleaving the optimizers round by round so that the
machine's noise hits all of them alike. Prints the median milliseconds and
the ratios the project tracks:

    LARS / SGD(momentum=0.9)   goal <= 1.4 (TF), 1.3 (JAX)
    LAMB / Adam                goal <= 1.35 (TF), 1.3 (JAX)
    LAMB / keras Lamb          goal <= 1.0

Mode "jax" runs in a child process on Keras's JAX backend: one jitted
`optimizer.stateless_apply` per optimizer, and optax's `lars` and `lamb`
beside them (outside anchors: optax lars / sgd, optax lamb / adamw).

    python -m keras_lars.tools.benchmark_optimizers [--rounds=15] [--modes=graph,xla,jax]
"""

import dataclasses
import json
import os
import subprocess
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from absl import app

import keras_lars
from keras_lars.tools import settings
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import setting

MODES = ("graph", "xla", "jax")
SHAPES = ("resnet50", "keras_resnet50")


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
    rounds: int = setting(15, "Timed rounds per optimizer and mode.", check=at_least(1))
    modes: tuple = setting(MODES, "Execution modes.", choices=MODES)
    shapes: str = setting(
        "resnet50",
        "resnet50: keras_lars.models.resnet50 (MLPerf v1.5, no "
        "conv biases); keras_resnet50: keras.applications.ResNet50.",
        choices=SHAPES,
    )

    def __post_init__(self):
        settings.check(self)


# Every optimizer trains with weight decay, as in real use: Keras's own apply
# it decoupled, to every variable; LARS and LAMB couple it into their update.
OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=1e-4),
    "lars": lambda: keras_lars.LARS(1.0, momentum=0.9, weight_decay=1e-4),
    "adam": lambda: keras.optimizers.Adam(1e-3, weight_decay=1e-2),
    "keras_lamb": lambda: keras.optimizers.Lamb(1e-3, weight_decay=1e-2),
    "lamb": lambda: keras_lars.LAMB(1e-3, weight_decay=1e-2),
}
RATIOS = [("lars", "sgd_momentum", 1.4), ("lamb", "adam", 1.35), ("lamb", "keras_lamb", 1.0)]
JAX_RATIOS = [
    ("lars", "sgd_momentum", 1.3),
    ("lamb", "adam", 1.3),
    ("lamb", "keras_lamb", 1.0),
    ("optax_lars", "optax_sgd_momentum", None),
    ("optax_lamb", "optax_adamw", None),
]


def resnet50_shapes(kind):
    if kind == "resnet50":
        from keras_lars.models import resnet50

        model = resnet50()
    else:
        model = keras.applications.ResNet50(weights=None)
    return [tuple(v.shape) for v in model.trainable_variables]


def make_apply(optimizer, shapes, jit_compile):
    rng = np.random.default_rng(0)
    variables = [
        keras.Variable(rng.normal(0, 0.05, s).astype("float32"), name=f"v{i}")
        for i, s in enumerate(shapes)
    ]
    grads = [tf.constant(rng.normal(0, 1e-3, s).astype("float32")) for s in shapes]
    optimizer.build(variables)

    @tf.function(jit_compile=jit_compile)
    def apply():
        optimizer.apply(grads, variables)

    return apply


def _interleaved(applies, rounds):
    """{name: median ms} of calling each `applies` entry once per round."""
    for apply in applies.values():  # trace, compile, warm up
        apply()
        apply()
    times = {name: [] for name in applies}
    for _ in range(rounds):
        for name, apply in applies.items():
            start = time.perf_counter()
            apply()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


def jax_applies(shapes):
    """On Keras's JAX backend: one jitted stateless apply per optimizer,
    and optax's lars, sgd, lamb and adamw with the same hyperparameters."""
    import importlib.util

    import jax

    rng = np.random.default_rng(0)
    params = [jax.numpy.asarray(rng.normal(0, 0.05, s).astype("float32")) for s in shapes]
    grads = [jax.numpy.asarray(rng.normal(0, 1e-3, s).astype("float32")) for s in shapes]
    applies = {}
    for name, build in OPTIMIZERS.items():
        optimizer = build()
        optimizer.build([keras.Variable(p, name=f"v{i}") for i, p in enumerate(params)])
        state = [v.value for v in optimizer.variables]
        step = jax.jit(optimizer.stateless_apply)
        applies[name] = lambda step=step, state=state: jax.block_until_ready(
            step(state, grads, params)
        )
    if importlib.util.find_spec("optax") is None:
        print("optax is not installed (pip install optax): no outside anchors", file=sys.stderr)
        return applies
    import optax

    transforms = {
        "optax_sgd_momentum": optax.chain(
            optax.add_decayed_weights(1e-4), optax.sgd(0.1, momentum=0.9)
        ),
        "optax_lars": optax.lars(1.0, weight_decay=1e-4, momentum=0.9),
        "optax_adamw": optax.adamw(1e-3, weight_decay=1e-2),
        "optax_lamb": optax.lamb(1e-3, weight_decay=1e-2),
    }
    for name, transform in transforms.items():

        def update(state, grads, params, transform=transform):
            updates, state = transform.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        # Arguments, not closed-over constants: XLA would fold their norms.
        step, state = jax.jit(update), transform.init(params)
        applies[name] = lambda step=step, state=state: jax.block_until_ready(
            step(state, grads, params)
        )
    return applies


def jax_child(shapes_kind, rounds):
    """The "jax" mode, in a process whose KERAS_BACKEND is jax: prints JSON."""
    import jax

    assert keras.backend.backend() == "jax", keras.backend.backend()
    results = _interleaved(jax_applies(resnet50_shapes(shapes_kind)), rounds)
    print(json.dumps({"ms": results, "jax": jax.__version__}))


def measure_jax(shapes_kind, rounds):
    code = (
        "import sys; from keras_lars.tools import benchmark_optimizers as b; "
        "b.jax_child(sys.argv[1], int(sys.argv[2]))"
    )
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, "-c", code, shapes_kind, str(rounds)],
        env=env,
        capture_output=True,
        text=True,
    )
    if completed.returncode:
        raise RuntimeError(f"the JAX benchmark failed:\n{completed.stderr[-3000:]}")
    if "optax is not installed" in completed.stderr:
        print("optax is not installed (pip install optax): no outside anchors")
    return json.loads(completed.stdout.strip().splitlines()[-1])["ms"]


def measure(shapes, modes, rounds, shapes_kind="resnet50"):
    """{mode: {optimizer: median ms}}, optimizers interleaved per round."""
    results = {}
    for mode in modes:
        if mode == "jax":
            results[mode] = measure_jax(shapes_kind, rounds)
            continue
        applies = {
            name: make_apply(build(), shapes, mode == "xla") for name, build in OPTIMIZERS.items()
        }
        results[mode] = _interleaved(applies, rounds)
    return results


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    tf.get_logger().setLevel("ERROR")
    options = settings.options_from_flags(BenchmarkSettings)
    shapes = resnet50_shapes(options.shapes)
    print(
        f"{len(shapes)} variables, {sum(int(np.prod(s)) for s in shapes):,} parameters, "
        f"TF {tf.__version__}, Keras {keras.__version__}, {os.cpu_count()} CPUs"
    )
    results = measure(shapes, options.modes, options.rounds, options.shapes)
    for mode, ms in results.items():
        print(
            f"\n[{mode}] median ms per apply: "
            + ", ".join(f"{name} {value:.1f}" for name, value in ms.items())
        )
        for ours, baseline, goal in JAX_RATIOS if mode == "jax" else RATIOS:
            if ours not in ms:
                continue
            ratio = ms[ours] / ms[baseline]
            if goal is None:
                print(f"  {ours} / {baseline} = {ratio:.2f}  (outside anchor)")
                continue
            verdict = "ok" if ratio <= goal else "over goal"
            print(f"  {ours} / {baseline} = {ratio:.2f}  (goal <= {goal}: {verdict})")


def run(argv=None):
    settings.define_flags(BenchmarkSettings)
    app.run(main, argv)


if __name__ == "__main__":
    run()
