"""The hybrid layout: each layer data- or model-parallel, as Krizhevsky's "one
weird trick" (arXiv:1404.5997) splits AlexNet, on a (batch, model) mesh.

A layer goes model-parallel where `step.LayerChoice` finds it cheaper (its
activations move fewer bytes than its gradient: below the break-even batch;
AlexNet's fc6, fc7 and fc8 at a few hundred images), with the training
tool's split (layout_file.model_parallel_layouts): a dense kernel by its
input features, a convolution by its output channels. The rest is
replicated: data-parallel over the "batch" axis, whose b = p / m devices
split the batch (the m devices of one "model" row compute the replicated
layers on the same images). For each m >= 2 that divides the devices and
the split dimensions, with n = B / b images a device:

    step(m) = compute(replicated layers, n) + compute(split layers, n) / m
              + c_fixed + exposed(collectives.layout_bytes(...) / bandwidth)

and the plan is the m of the shortest step. Both layouts are priced as the
main plan prices data parallelism (step.py): `bandwidth` is the bytes a
device sends a step under data parallelism over the plan's all-reduce time
(its algorithm over the cluster's links), and with overlap the backward pass
(2/3 of the compute) hides the collectives, so the data-parallel step here
is the main plan's step. (Pricing every byte at one node link's share of a
device, without overlap, made 64 AlexNet replicas 309.8 ms a step here
against the plan's 44.3 ms.)
"""

import dataclasses
import re

from keras_lars.tools.plan.collectives import layout_bytes
from keras_lars.tools.plan.collectives import model_graph
from keras_lars.tools.plan.device import ModelProfile
from keras_lars.tools.plan.step import BACKWARD_FRACTION
from keras_lars.tools.plan.step import exposed_communication
from keras_lars.tools.plan.step import layer_choices


@dataclasses.dataclass(frozen=True)
class HybridPlan:
    """A mesh (b, m), the layouts {path regex: axes}, the bytes one device
    sends a step and the step's seconds, with pure data parallelism's."""

    mesh: tuple
    layouts: dict
    bytes: float
    seconds: float
    data_parallel_bytes: float
    data_parallel_seconds: float
    bandwidth: float  # bytes/s a device sends at: data parallelism's bytes over its all-reduce


def model_parallel_layers(profile, global_batch):
    """Names of the layers that move fewer bytes model-parallel."""
    return [c.layer.name for c in layer_choices(profile, global_batch) if c.cheaper == "model"]


def layer_layouts(model_name, image_size, names, model_axis_size):
    """{escaped kernel path: axes} of the layers `names`, split as the
    training tool splits them, where `model_axis_size` divides the dimension."""
    layouts, replicated = {}, []
    for node in model_graph(model_name, image_size):
        if node.kind in ("Conv2D", "MaxPooling2D") and node.name not in names:
            replicated.append(re.escape(node.name))
        for path, shape in node.variables.items():
            if node.name not in names or not path.endswith("kernel"):
                continue
            if node.kind == "Dense" and shape[0] % model_axis_size == 0:
                layouts[re.escape(path)] = ("model", None)
            elif node.kind == "Conv2D" and shape[-1] % model_axis_size == 0:
                layouts[re.escape(path)] = (None, None, None, "model")
    if layouts and replicated:
        # Left alone, XLA splits the replicated convolutions' (and pools') image rows over the
        # idle "model" axis (halo exchanges, measured: 40 MB of collective-permutes
        # a step for AlexNet at batch 256 on 4 x 2); their outputs are pinned to
        # the batch split instead, the data parallelism this plan prices.
        layouts[f"(?:{'|'.join(replicated)})/output"] = ("batch", None, None, None)
    return layouts


def _compute(profile, device, per_device, names, model_axis_size):
    split = ModelProfile("split", tuple(x for x in profile.layers if x.name in names))
    whole = ModelProfile("whole", tuple(x for x in profile.layers if x.name not in names))
    seconds = device.compute_seconds(whole, per_device) if whole.layers else 0.0
    if split.layers:
        seconds += device.compute_seconds(split, per_device) / model_axis_size
    return seconds


def _step(compute, moved, bandwidth, device, overlap):
    """compute + c_fixed + the collectives the backward pass does not hide."""
    exposed = exposed_communication(moved / bandwidth, BACKWARD_FRACTION * compute, overlap)
    return compute + device.fixed_step_seconds + exposed


def hybrid_plan(
    model_name, image_size, profile, global_batch, devices, device, allreduce_seconds, overlap
):
    """The HybridPlan of the shortest step over m >= 2 (None when no m
    divides the devices and the split layers, or no layer is cheaper
    model-parallel); `allreduce_seconds`: the main plan's data-parallel
    all-reduce, `overlap`: its --overlap (module docstring)."""
    names = set(model_parallel_layers(profile, global_batch))
    dp_bytes = sum(layout_bytes(model_name, image_size, global_batch, (devices, 1), {}).values())
    bandwidth = dp_bytes / allreduce_seconds
    dp_compute = _compute(profile, device, global_batch / devices, (), 1)
    dp_seconds = _step(dp_compute, dp_bytes, bandwidth, device, overlap)
    best = None
    for m in range(2, devices + 1):
        if devices % m or (global_batch * m) % devices:
            continue
        layouts = layer_layouts(model_name, image_size, names, m)
        if not names or sum(not p.endswith("/output") for p in layouts) < len(names):
            continue
        mesh = (devices // m, m)
        moved = sum(layout_bytes(model_name, image_size, global_batch, mesh, layouts).values())
        compute = _compute(profile, device, global_batch / mesh[0], names, m)
        seconds = _step(compute, moved, bandwidth, device, overlap)
        if best is None or seconds < best.seconds:
            best = HybridPlan(mesh, layouts, moved, seconds, dp_bytes, dp_seconds, bandwidth)
    return best
