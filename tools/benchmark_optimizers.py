"""Apply-time benchmark of LARS and LAMB against Keras's own optimizers.

Builds variables with ResNet-50's shapes (25.6M parameters), then times one
`optimizer.apply(gradients, variables)` per optimizer, in TF graph mode and
compiled with XLA, interleaving the optimizers round by round so that the
machine's noise hits all of them alike. Prints the median milliseconds and
the ratios the project tracks:

    LARS / SGD(momentum=0.9)   goal <= 1.4
    LAMB / Adam                goal <= 1.35
    LAMB / keras Lamb          goal <= 1.0

    python -m keras_lars.tools.benchmark_optimizers [--rounds=15] [--modes=graph,xla]
"""

import dataclasses
import os
import time

import keras
import numpy as np
import tensorflow as tf
from absl import app

import keras_lars
from keras_lars.tools import settings
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import setting

MODES = ("graph", "xla")
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


def measure(shapes, modes, rounds):
    """{mode: {optimizer: median ms}}, optimizers interleaved per round."""
    results = {}
    for mode in modes:
        applies = {
            name: make_apply(build(), shapes, mode == "xla") for name, build in OPTIMIZERS.items()
        }
        for apply in applies.values():  # trace, compile, warm up
            apply()
            apply()
        times = {name: [] for name in applies}
        for _ in range(rounds):
            for name, apply in applies.items():
                start = time.perf_counter()
                apply()
                times[name].append(time.perf_counter() - start)
        results[mode] = {name: 1e3 * float(np.median(t)) for name, t in times.items()}
    return results


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    tf.get_logger().setLevel("ERROR")
    options = BenchmarkSettings(**settings.from_flags(BenchmarkSettings)[0])
    shapes = resnet50_shapes(options.shapes)
    print(
        f"{len(shapes)} variables, {sum(int(np.prod(s)) for s in shapes):,} parameters, "
        f"TF {tf.__version__}, Keras {keras.__version__}, {os.cpu_count()} CPUs"
    )
    results = measure(shapes, options.modes, options.rounds)
    for mode, ms in results.items():
        print(
            f"\n[{mode}] median ms per apply: "
            + ", ".join(f"{name} {value:.1f}" for name, value in ms.items())
        )
        for ours, baseline, goal in RATIOS:
            ratio = ms[ours] / ms[baseline]
            verdict = "ok" if ratio <= goal else "over goal"
            print(f"  {ours} / {baseline} = {ratio:.2f}  (goal <= {goal}: {verdict})")


def run(argv=None):
    settings.define_flags(BenchmarkSettings)
    app.run(main, argv)


if __name__ == "__main__":
    run()
