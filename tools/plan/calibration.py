"""Per-device training throughput, measured or published, and what the
device model (device.py) takes from it.

A `Throughput` is one device's ResNet-50 training images/s r at b images a
device, with its source. On one device and precision the seconds of a step
of b images lie on a line:

    b / r(b) = c + s b,   s = t_image / u,   c = c_fixed + b_half s

so rates at batch sizes at least SPAN apart give s and c (least squares), and
u = t_image / s (t_image: the roofline seconds of one trained image on the
device's peaks, device.ModelProfile.image_seconds). A line cannot tell
c_fixed from b_half: `calibrate` puts the optimizer update's memory time
(`update_seconds`) in c_fixed and the rest of c in b_half. Rates at nearby
batch sizes give u (their mean) with c = c_fixed = the update's time,
b_half = 0. u above 1 means the device beats the per-layer roofline, which
counts every batch norm and ReLU as its own pass over memory where the
frameworks fuse them.
"""

import dataclasses
import statistics

from keras_lars.recipes import IMAGENET_TRAIN_EXAMPLES
from keras_lars.tools.plan.device import DTYPE_BYTES

# LARS's update reads w, g, v and, for the two norms, w and g again; writes w, v
UPDATE_PASSES = 7
MASTER_BYTES = 4  # weights, gradients and slots of the update in float32
SPAN = 2  # a line is fitted only through batch sizes at least 2x apart


def update_seconds(parameters, memory_bandwidth):
    """c_fixed: the optimizer update, memory-bound, 7 float32 passes over the
    parameters: 7 * 4 * P / M seconds (0 without a bandwidth)."""
    if not memory_bandwidth:
        return 0.0
    return UPDATE_PASSES * MASTER_BYTES * parameters / memory_bandwidth


@dataclasses.dataclass(frozen=True)
class Throughput:
    """ResNet-50 (224x224) training images/s of one device at `batch` images
    a device, activations in `dtype`."""

    device: str
    dtype: str
    batch: int
    images_per_second: float
    source: str


def _mlperf_rate(epochs, seconds, devices):
    """Images/s a device of an MLPerf single-node run: epochs * N / time / p
    (the time holds the evaluations too: a lower bound)."""
    return epochs * IMAGENET_TRAIN_EXAMPLES / seconds / devices


_DLE = (
    "NVIDIA DeepLearningExamples, MxNet/Classification/RN50v1.5/README.md, "
    "'Training performance' (1 GPU row, mxnet-20.12)"
)
THROUGHPUTS = (
    Throughput("V100-SXM2-16GB", "float16", 192, 1376, _DLE + ", DGX-1 16GB"),
    Throughput("V100-SXM2-16GB", "float32", 96, 384, _DLE + ", DGX-1 16GB"),
    Throughput("V100-SXM3-32GB", "float16", 256, 1492, _DLE + ", DGX-2 32GB"),
    Throughput("V100-SXM3-32GB", "float32", 128, 417, _DLE + ", DGX-2 32GB"),
    Throughput("A100-SXM4-80GB", "float16", 256, 2180, _DLE + ", DGX A100 80GB"),
    Throughput(
        "V100-SXM2-16GB",
        "float16",
        1664 // 8,
        _mlperf_rate(60, 6913.2, 8),
        "MLPerf Training v0.6, NVIDIA dgx1_ngc19.05_mxnet (8 V100, batch 1664, 60 "
        "epochs, 6,913 s; github.com/mlcommons/training_results_v0.6)",
    ),
    Throughput(
        "A100-SXM4-40GB",
        "float16",
        3264 // 8,
        _mlperf_rate(41, 2386.8, 8),
        "MLPerf Training v0.7, NVIDIA dgxa100_ngc20.06_mxnet (8 A100, batch 3264, 41 "
        "epochs, 2,387 s; github.com/mlcommons/training_results_v0.7)",
    ),
)


# this machine (2 shared cores, TF 2.21): the training tool's ResNet-50 at 64x64 on
# synthetic data, `python -m keras_lars.tools.benchmark_train --size=64 --batch=B
# --steps=3 --rounds=2 --records=16` for B = 2, 8, 32 (2026-12-01, 2.7 min in all)
HERE_COMMAND = "python -m keras_lars.tools.benchmark_train --size=64 --steps=3 --rounds=2"
HERE = ((2, 8.3), (8, 19.2), (32, 24.3))  # (images a step, images/s)


def fit_line(points):
    """(c, s) of the least-squares line b / r = c + s b through
    `points` = [(b, r), ...] (at least two batch sizes)."""
    xs = [b for b, _ in points]
    ys = [b / r for b, r in points]
    if len(set(xs)) < 2:
        raise ValueError("fit_line needs rates at two or more batch sizes")
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    return mean_y - slope * mean_x, slope


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What the rates of one device and dtype give the device model."""

    utilization: float
    half_batch: float
    fixed_step_seconds: float
    points: tuple


def calibrate(spec, dtype, profile, throughputs=THROUGHPUTS):
    """The Calibration of `spec` (device.DeviceSpec) at `dtype` from the
    `throughputs` of that device and dtype (None if there are none)."""
    points = tuple(t for t in throughputs if t.device == spec.name and t.dtype == dtype)
    if not points:
        return None
    t_image = profile.image_seconds(spec.peak(dtype), spec.memory_bandwidth, DTYPE_BYTES[dtype])
    fixed = update_seconds(profile.parameters, spec.memory_bandwidth)
    batches = [t.batch for t in points]
    if max(batches) >= SPAN * min(batches):
        intercept, slope = fit_line([(t.batch, t.images_per_second) for t in points])
        half_batch = max(0.0, (intercept - fixed) / slope)
        return Calibration(t_image / slope, half_batch, fixed, points)
    slopes = [(t.batch / t.images_per_second - fixed) / t.batch for t in points]
    return Calibration(t_image / statistics.fmean(slopes), 0.0, fixed, points)
