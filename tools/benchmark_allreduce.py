"""All-reduce times of MultiWorkerMirroredStrategy on this machine, and the
alpha and beta of the ring model that they give.

    python -m keras_lars.tools.benchmark_allreduce                 # 2 and 4 workers
    python -m keras_lars.tools.benchmark_allreduce --workers=2 --max_bytes=4194304

For each worker count p it starts p real worker processes on localhost (TF_CONFIG
on free ports, the ring implementation), each all-reducing messages of n bytes
from --min_bytes to --max_bytes (x4 each) in float32 and bfloat16, in two forms:

    one     one tensor of n bytes
    split   64 tensors of n/64 bytes in one all_reduce call, packed by TensorFlow
            into one collective (CommunicationOptions(bytes_per_pack=n))

and prints the median of --repeats timed calls (after warm-up calls). It fits
the ring model of keras_lars.tools.plan.ring_allreduce,

    T(n) = 2 (p - 1) alpha + 2 (p - 1) / p * n * beta,

by least squares on the float32 "one" times, and prints, for bfloat16 against
float32 (Jia et al. 2018), the bytes on the wire (1/2) and the time ratio. All
processes share this machine's cores: alpha and beta describe localhost, not a
network; use them for `keras-lars-plan --inter_alpha/--inter_bandwidth` only to
plan runs on this machine.
"""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app

from keras_lars.tools import settings
from keras_lars.tools.plan import ring_allreduce
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import setting

DTYPES = ("float32", "bfloat16")
FORMS = {"one": 1, "split": 64}  # tensors per all_reduce call
ITEM_BYTES = {"float32": 4, "bfloat16": 2}
WARMUP_CALLS = 3


def _worker_counts(value, config):
    if not value or not all(v.isdigit() and int(v) >= 2 for v in value):
        return "must be a list of worker counts >= 2"
    return None


@dataclasses.dataclass(frozen=True)
class AllReduceSettings:
    workers: tuple = setting(("2", "4"), "Worker counts p to measure.", check=_worker_counts)
    min_bytes: int = setting(4096, "Smallest message (float32 bytes).", check=at_least(256))
    max_bytes: int = setting(
        64 * 2**20,
        "Largest message (float32 bytes); sizes grow x4 from --min_bytes.",
        check=lambda value, c: None if value >= c.min_bytes else "must be >= --min_bytes",
    )
    repeats: int = setting(10, "Timed calls per size, form and dtype.", check=at_least(1))

    def __post_init__(self):
        settings.check(self)

    @property
    def sizes(self):
        sizes, size = [], self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            size *= 4
        return sizes


# --- one worker process ------------------------------------------------------------
def worker(spec_path, out_path):
    """Runs in each worker process: times every (dtype, form, size) and, on
    worker 0, writes the medians to `out_path` as JSON."""
    import tensorflow as tf

    with open(spec_path) as f:
        spec = json.load(f)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    rows = []
    for dtype in DTYPES:
        for form, count in FORMS.items():
            for size in spec["sizes"]:
                elements = max(1, size // 4 // count)  # the float32 message's elements
                with strategy.scope():
                    tensors = [tf.Variable(tf.ones([elements])) for _ in range(count)]
                pack = tf.distribute.experimental.CommunicationOptions(
                    bytes_per_pack=max(1, size), implementation=options.implementation
                )

                @tf.function
                def reduce(tensors=tensors, pack=pack, dtype=dtype):
                    def replica():
                        context = tf.distribute.get_replica_context()
                        # Cast as keras_lars's allreduce_dtype does (no-op for float32).
                        values = [tf.cast(t.read_value(), dtype) for t in tensors]
                        return context.all_reduce("sum", values, options=pack)

                    return strategy.run(replica)

                times = []
                for call in range(WARMUP_CALLS + spec["repeats"]):
                    started = time.perf_counter()
                    result = reduce()
                    float(result[0][0])  # waits for the collective
                    if call >= WARMUP_CALLS:
                        times.append(time.perf_counter() - started)
                rows.append(
                    {
                        "dtype": dtype,
                        "form": form,
                        "float32_bytes": size,
                        "bytes": elements * count * ITEM_BYTES[dtype],
                        "seconds": float(np.median(times)),
                    }
                )
    if strategy.cluster_resolver.task_id == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)


# --- the benchmark -----------------------------------------------------------------
def free_ports(count):
    """`count` free localhost ports (for a cluster of local processes)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def measure(workers, sizes, repeats, timeout=1800):
    """Rows of worker 0's medians for a cluster of `workers` processes."""
    folder = tempfile.mkdtemp(prefix="keras_lars_allreduce_")
    spec_path, out_path = os.path.join(folder, "spec.json"), os.path.join(folder, "rows.json")
    with open(spec_path, "w") as f:
        json.dump({"sizes": sizes, "repeats": repeats}, f)
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(workers)]}
    code = (
        "import sys; from keras_lars.tools import benchmark_allreduce as b; b.worker(*sys.argv[1:])"
    )
    processes = []
    for index in range(workers):
        env = dict(
            os.environ,
            TF_CPP_MIN_LOG_LEVEL="3",
            CUDA_VISIBLE_DEVICES="",
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", code, spec_path, out_path],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        errors = [p.communicate(timeout=timeout)[1] for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in processes):
        failed = next(e for p, e in zip(processes, errors) if p.returncode)
        raise RuntimeError(f"a worker of {workers} failed:\n{failed[-2000:]}")
    with open(out_path) as f:
        return json.load(f)


def fit_ring(rows, workers):
    """(alpha, beta) of T = 2(p-1) alpha + 2(p-1)/p n beta over the float32
    single-tensor rows: least squares of the relative error (each row over
    its time, so that 4 KB counts as much as 64 MB), both clipped at >= 0."""
    chosen = [r for r in rows if r["dtype"] == "float32" and r["form"] == "one"]
    design = np.array(
        [[2 * (workers - 1), 2 * (workers - 1) / workers * r["bytes"]] for r in chosen]
    )
    times = np.array([r["seconds"] for r in chosen])
    (alpha, beta), *_ = np.linalg.lstsq(design / times[:, None], np.ones_like(times), rcond=None)
    return max(float(alpha), 0.0), max(float(beta), 0.0)


def report(rows, workers):
    alpha, beta = fit_ring(rows, workers)
    lines = [
        f"{workers} workers on localhost (ring): alpha = {alpha * 1e6:.1f} us, "
        f"1/beta = {1 / beta / 1e9 if beta else float('inf'):.2f} GB/s",
        f"{'bytes':>12} {'form':>6} {'float32 ms':>11} {'model ms':>9} {'bfloat16 ms':>12}"
        f" {'bf16/f32 bytes':>15} {'bf16/f32 time':>14}",
    ]
    by_key = {(r["dtype"], r["form"], r["float32_bytes"]): r for r in rows}
    for form in FORMS:
        for size in sorted({r["float32_bytes"] for r in rows}):
            full, half = by_key[("float32", form, size)], by_key[("bfloat16", form, size)]
            model = ring_allreduce(full["bytes"], workers, alpha, beta)
            lines.append(
                f"{full['bytes']:>12,} {form:>6} {full['seconds'] * 1e3:>11.3f} "
                f"{model * 1e3:>9.3f} {half['seconds'] * 1e3:>12.3f} "
                f"{half['bytes'] / full['bytes']:>15.2f} {half['seconds'] / full['seconds']:>14.2f}"
            )
    return "\n".join(lines), alpha, beta


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    options = settings.options_from_flags(AllReduceSettings)
    print(f"{os.cpu_count()} CPUs; medians of {options.repeats} calls after {WARMUP_CALLS}")
    for workers in map(int, options.workers):
        text, _, _ = report(measure(workers, options.sizes, options.repeats), workers)
        print(text, flush=True)


def run(argv=None):
    settings.define_flags(AllReduceSettings)
    app.run(main, argv)


if __name__ == "__main__":
    run()
