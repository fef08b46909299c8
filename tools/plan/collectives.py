"""The bytes a layout's collectives move in one training step, layer by layer,
as XLA's SPMD partitioner (GSPMD) compiles the training tool's JAX step.

A layout is a (batch, model) mesh of b x m devices and {variable path
regex: partition spec} (the keras.distribution LayoutMap; unmatched
variables are replicated). The batch is split b ways (n = B / b images a
device); a layer's output channels are whole (R) or split m ways over
"model" (S). Bytes moved follow hlo.py's convention (one device's sends
with ring algorithms over g devices: all-reduce 2 (g - 1) / g x, all-gather
(g - 1) / g x, x the buffer), s = 4 bytes (float32). Per step:

    gradients   every variable: all-reduce over the b batch devices of its
                share, P / m if sharded (or computed from S gradients) else P
    batch norm  XLA all-reduces 4 C values per layer over the batch devices
                beyond the gamma and beta gradients (forward mean and
                variance, backward the sums of dy and dy x_hat; C / m when S)
    scalars     3: the loss's sum, its weight and the step's sample count
    conv, S kernel (output channels over "model"):
                forward: an S input is all-gathered over "model" (n I s), and
                gathered again in the backward pass for the kernel's gradient
                (XLA does not keep the copy, measured at 224x224); backward:
                the input gradient is a partial sum over the output channels,
                all-reduced over "model" (n I s), unless the input is the
                model's (through layers without variables)
    conv or dense, whole kernel, S input: XLA moves the fewer bytes of
                gathering the input once (n I s, also when several layers
                read it) and keeping it split: partial outputs all-reduced
                (2 n O s); the kernel's gradient comes out S either way
    Flatten of an S map wider than 1x1: all-gathered (n I s)
    dense, kernel split by inputs ("model", None): each device's partial
                output is all-reduced over "model" (n O s); its input is
                kept S (below)
    kept split: XLA keeps a tensor S where a dense layer split by inputs
                reads it, and upstream of it through the layers that map
                channel c to channel c (CHANNELWISE: the residual stream of
                ResNet-50's stage 4 back from the classifier), up to the
                first layer that does not (its producer: a conv, a dense, a
                Flatten): both passes keep these outputs S (a batch norm's
                statistics C / m, its gamma and beta updated on the shards);
                backward, the producer all-gathers its output gradient for
                its input gradient (n O s) unless its input is the model's,
                and a conv reading an S input once more for its kernel's
                gradient (x_S^T dy needs dy whole); a producer whose own S
                kernel splits its output keeps it split and gathers nothing
    dense, kernel split by outputs (None, "model"): as a conv with an S
                kernel (not among the measured layouts)
    LARS        2 scalars a split kernel (its norms' partial sums), over b m
    updates     a replicated variable whose gradient is S (the bias of a
                split layer, a batch norm's gamma and beta after it, a whole
                kernel read from an S input, the variables of a layer whose
                output is kept S): XLA computes its update on the m shards
                and all-gathers the new value and its momentum, 2 P (the new
                value alone, P, where Keras's train step constrains the state it
                returns to the shardings fit recorded: Keras 3.10 and 3.11,
                gathers_per_update)

(measured on the compiled HLO of the tool's step, tools/plan/hlo_bytes.py;
docs/planning.md has the table.) `layout_bytes` sums them by collective.
"""

import dataclasses
import functools
import math
import re

import keras

from keras_lars import compat
from keras_lars.models import BUILDERS
from keras_lars.tools import layout_file
from keras_lars.tools.shapes_only import built_shapes_only

FLOAT_BYTES = 4
LOSS_SCALARS = 3  # all-reduced every step: the loss's sum and weight, the sample count
LARS_NORMS = 2  # a sharded kernel's ||w|| and ||update|| partial sums, all-reduced
# Layers mapping channel c to channel c: a split over channels passes through them.
CHANNELWISE = (
    "Activation",
    "Add",
    "AveragePooling2D",
    "BatchNormalization",
    "Dropout",
    "GlobalAveragePooling2D",
    "GlobalMaxPooling2D",
    "MaxPooling2D",
    "ReLU",
    "ZeroPadding2D",
)
BN_STATISTICS = 4  # values per batch-norm channel all-reduced beyond its gradients


@dataclasses.dataclass(frozen=True)
class Node:
    """One layer: kind, variables {path: shape}, inbound layer names, and
    per image the elements of its (first) input and of its output."""

    name: str
    kind: str
    variables: dict
    inputs: tuple
    input_elements: int
    output_elements: int
    input_channels: int


def _elements(shape):
    return math.prod(int(d) for d in shape[1:])


@functools.cache
def model_graph(name, image_size=224, num_classes=1000):
    """The Nodes of keras_lars.models.BUILDERS[name], in order (built on the
    CPU for its shapes alone: shapes_only.built_shapes_only)."""
    with keras.device("cpu:0"):
        model = built_shapes_only(
            lambda: BUILDERS[name](num_classes=num_classes, input_shape=(image_size, image_size, 3))
        )
    nodes = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        inputs = layer.input if isinstance(layer.input, (list, tuple)) else [layer.input]
        inbound = tuple(t._keras_history.operation.name for t in inputs)
        nodes.append(
            Node(
                layer.name,
                type(layer).__name__,
                {v.path: tuple(v.shape) for v in layer.trainable_weights},
                inbound,
                _elements(inputs[0].shape),
                _elements(layer.output.shape),
                int(inputs[0].shape[-1]),
            )
        )
    return tuple(nodes)


def spec_of(path, layouts):
    """The partition spec of `path`: the one regex of `layouts` it fully
    matches (as keras.distribution.LayoutMap looks it up), else None."""
    if path in layouts:
        return tuple(layouts[path])
    found = [pattern for pattern in layouts if re.fullmatch(pattern, path)]
    if len(found) > 1:
        raise ValueError(f"{path} matches several layouts: {found}")
    return tuple(layouts[found[0]]) if found else None


def _all_reduce(values, group):
    return 2 * (group - 1) / group * values * FLOAT_BYTES if group > 1 else 0.0


def _all_gather(values, group):
    return (group - 1) / group * values * FLOAT_BYTES if group > 1 else 0.0


def _kernel_spec(node, layouts, m):
    specs = [spec_of(p, layouts) for p in node.variables if p.endswith("kernel")]
    return specs[0] if specs and m > 1 else None


def _kept(nodes, layouts, m):
    """{layer: producer?}: the layers whose outputs XLA keeps split
    (module docstring): upstream of each input of a dense layer split by
    inputs through CHANNELWISE layers (False), to their producers (True)."""
    by_name = {node.name: node for node in nodes}
    kept = {}
    pending = [
        node.inputs[0]
        for node in nodes
        if node.kind == "Dense" and (_kernel_spec(node, layouts, m) or (None,))[0] == "model"
    ]
    while pending:
        name = pending.pop()
        if name not in by_name or name in kept:
            continue  # the model's input, or walked already
        node = by_name[name]
        kept[name] = node.kind not in CHANNELWISE
        if not kept[name]:
            pending.extend(node.inputs)
    return kept


def _forward(nodes, layouts, m, kept):
    """{layer: (kernel spec, output split, input split, output split by its
    own kernel)} in layer order."""
    states, split = {}, {}
    for node in nodes:
        kernel = _kernel_spec(node, layouts, m)
        input_split = any(split.get(name, False) for name in node.inputs)
        own = input_split
        if node.kind in ("Conv2D", "Dense"):
            sharded = bool(kernel) and "model" in kernel
            own = sharded and not (node.kind == "Dense" and kernel[0] == "model")
        elif node.kind == "Flatten" and node.input_elements != node.input_channels:
            own = False  # a split H x W x C map does not flatten to split features
        split[node.name] = own or node.name in kept
        states[node.name] = (kernel, split[node.name], input_split, own)
    return states


def _reads_images(node, nodes):
    """The layer's input is the model's, through layers without variables
    (no input gradient is computed)."""
    by_name = {n.name: n for n in nodes}
    name = node.inputs[0]
    while name in by_name and not by_name[name].variables:
        name = by_name[name].inputs[0]
    return name not in by_name


def gathers_per_update():
    """All-gathers of a replicated variable that XLA updates on its shards (the
    module docstring's "updates"): its new value and its momentum, 2; the new
    value alone, 1, where Keras's train step constrains its returned state to
    the shardings fit recorded (compat.RECORDED_STATE_SHARDINGS). Measured
    on ResNet-50's model-parallel step, 8 devices, 224x224, batch 256: Keras
    3.15.1 gathered 74.2 MB in one instruction, Keras 3.10.0 37.1 MB (LARS's
    w - update), the rest alike (2026-12-04)."""
    low, high = compat.RECORDED_STATE_SHARDINGS
    return 1 if low <= compat.installed_version("keras")[:2] <= high else 2


def layout_bytes(model_name, image_size, global_batch, mesh, layouts, num_classes=1000):
    """{"all-reduce": bytes, "all-gather": bytes} one device sends in one
    step of `model_name` under `layouts` on `mesh` = (b, m)."""
    b, m = mesh
    n = global_batch / b
    moved = {"all-reduce": _all_reduce(LOSS_SCALARS, b * m), "all-gather": 0.0}
    nodes = model_graph(model_name, image_size, num_classes)
    kept = _kept(nodes, layouts, m)
    states = _forward(nodes, layouts, m, kept)
    gathered = set()  # split tensors already gathered (XLA gathers one once)
    update_gathers = gathers_per_update()
    for node in nodes:
        kernel, out_split, input_split, own_split = states[node.name]
        sharded = bool(kernel) and "model" in kernel
        activations_in, activations_out = n * node.input_elements, n * node.output_elements
        if node.kind in ("Conv2D", "Dense") and sharded and kernel[0] == "model":
            moved["all-reduce"] += _all_reduce(activations_out, m)  # partial outputs
        elif node.kind in ("Conv2D", "Dense", "Flatten") and input_split:
            gather, keep = _all_gather(activations_in, m), _all_reduce(activations_out, m)
            if sharded or node.kind == "Flatten" or gather <= keep:
                if node.inputs[0] not in gathered:
                    gathered.add(node.inputs[0])
                    moved["all-gather"] += gather
                    if sharded:  # gathered again for the kernel's gradient
                        moved["all-gather"] += gather
            else:  # kept split: partial outputs
                moved["all-reduce"] += keep
        partial_input_gradients = sharded and kernel[0] != "model"
        if partial_input_gradients and not _reads_images(node, nodes):
            moved["all-reduce"] += _all_reduce(activations_in, m)
        if kept.get(node.name) and not own_split:  # the kept output's gradient, gathered
            reads_images = _reads_images(node, nodes)
            again = node.kind == "Conv2D" and input_split
            moved["all-gather"] += (1 - reads_images + again) * _all_gather(activations_out, m)
        if node.kind == "BatchNormalization":
            channels = next(iter(node.variables.values()))[0] / (m if out_split else 1)
            moved["all-reduce"] += _all_reduce(BN_STATISTICS * channels, b)
        for path, shape in node.variables.items():
            size = math.prod(shape)
            whole_kernel_split_input = path.endswith("kernel") and not sharded and input_split
            if path.endswith("kernel") and sharded:
                moved["all-reduce"] += _all_reduce(size / m, b)
                moved["all-reduce"] += _all_reduce(LARS_NORMS, b * m)
            elif out_split or whole_kernel_split_input:
                moved["all-reduce"] += _all_reduce(size / m, b)
                moved["all-gather"] += update_gathers * _all_gather(size, m)
            else:
                moved["all-reduce"] += _all_reduce(size, b)
    return moved


def plan_layout(model_name, image_size, layout, model_axis_size):
    """{path regex: spec} of the training tool's --distribution=`layout`
    (layout_file.model_parallel_layouts) for the model."""
    if layout == "data_parallel" or model_axis_size == 1:
        return {}
    shapes = {
        path: shape
        for node in model_graph(model_name, image_size)
        for path, shape in node.variables.items()
    }
    return {
        re.escape(path): spec
        for path, spec in layout_file.model_parallel_layouts(shapes, model_axis_size).items()
    }
