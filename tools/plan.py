"""Time-to-train planner: step time, scaling efficiency and time to train of
data-parallel training, from the model, the device, the cluster and the
all-reduce algorithm.

    keras-lars-plan                                    # ResNet-50 on 64 V100-class devices
    keras-lars-plan --devices=1024 --global_batch_size=32768 --algorithm=torus2d
    keras-lars-plan --model=alexnet --global_batch_size=1024 --layers
    keras-lars-plan --records        # published ImageNet records: published vs predicted

(also `python -m keras_lars.tools.plan`; `--help` documents every input).

One step of synchronous data parallelism over p devices, b = B / p images each:

    compute  = b * t_image / u                  (u: --utilization)
    t_image  = sum over layers l of max(3 F_l / P, 3 A_l s_a / M)
    comm     = all-reduce time of n = (trainable parameters) * s_g bytes
    exposed  = max(0, comm - backward)  with --overlap,  else comm
    backward = 2/3 * compute
    input    = max(0, b / R - compute - exposed)        (R: --input_images_per_second)
    step     = compute + exposed + input
    efficiency = compute / step;  steps = floor(epochs * floor(N / B) + 1/2)

F_l is layer l's forward FLOPs per image (a multiply-add counts 2): a
convolution 2 kh kw (cin / groups) cout Hout Wout, a dense layer 2 in out;
other layers 0. Training costs 3x the forward pass (backward: gradients of
inputs and of weights, 2x). A_l is the elements layer l reads and writes per
image (inputs + outputs), moved 3 times in training (forward; backward reads
the saved activations and the output gradient and writes the input gradient),
s_a bytes each (--activation_dtype). With a memory bandwidth M each layer
takes the longer of its compute and its memory time, a roofline (Williams,
Waterman & Patterson 2009, "Roofline", CACM 52(4)); with M = 0 only FLOPs
count. P is the device's peak FLOP/s at the arithmetic the run uses. Or give
--images_per_second, the device's measured training rate: compute = b / rate.

Parameters, FLOPs and activations are counted on the Keras model definitions
of keras_lars.models, built on the CPU (`model_profile`): ResNet-50 has
25,557,032 trainable parameters and 4,089,184,256 multiply-adds per 224x224
image (8.18 GFLOPs forward, 24.5 GFLOPs per trained image).

The all-reduce cost models (alpha: latency per message, beta: seconds per
byte, n bytes, p participants) are the functions `ring_allreduce`,
`tree_allreduce`, `halving_doubling_allreduce`, `hierarchical_allreduce` and
`torus2d_allreduce`; their docstrings give the formulas and sources.

`RECORDS` holds published ImageNet / ResNet-50 training times with the
hardware figures of their papers, `--records` prints them against this
model's predictions; one constant (`CALIBRATED_UTILIZATION`, the default
--utilization) is fitted on one record (`CALIBRATION_RECORD`). See
docs/planning.md for the equations, the table and what could not be verified.
Importing this module has no side effects.
"""

import dataclasses
import functools
import math

from absl import app

from keras_lars.recipes import IMAGENET_TRAIN_EXAMPLES
from keras_lars.recipes import epochs_to_steps
from keras_lars.recipes import resnet50_lars_recipe
from keras_lars.tools import settings
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import greater_than
from keras_lars.tools.settings import setting

TRAINING_FLOPS_FACTOR = 3  # forward + backward (2x forward)
BACKWARD_FRACTION = 2 / 3  # of the training compute
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ALGORITHMS = ("ring", "hierarchical", "torus2d", "tree", "halving_doubling")
MODELS = (
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "alexnet",
    "alexnet_bn",
    "custom",
)
GB = 1e9  # the flags' bandwidths are in GB/s (10^9 bytes per second)
US = 1e-6  # the flags' latencies are in microseconds


# --- all-reduce cost models (alpha-beta) --------------------------------------------
def ring_allreduce(n, p, alpha, beta):
    """Ring all-reduce (reduce-scatter then all-gather around a ring):

        T = 2 (p - 1) alpha + 2 (p - 1) / p * n beta

    p - 1 steps of each phase, every step moving n / p bytes to a neighbour.
    Bandwidth-optimal, latency linear in p. Thakur, Rabenseifner & Gropp
    2005, "Optimization of Collective Communication Operations in MPICH",
    IJHPCA 19(1). p = 1 costs nothing.
    """
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta


def tree_allreduce(n, p, alpha, beta):
    """Binomial-tree reduce to a root, then binomial-tree broadcast:

        T = 2 ceil(log2 p) (alpha + n beta)

    Each of the ceil(log2 p) rounds of either tree sends the whole n bytes
    (Thakur, Rabenseifner & Gropp 2005: binomial broadcast ceil(log2 p)
    (alpha + n beta)). Few messages, but every byte crosses 2 log2 p links:
    good for small n only.
    """
    if p <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * (alpha + n * beta)


def halving_doubling_allreduce(n, p, alpha, beta):
    """Rabenseifner's all-reduce: reduce-scatter by recursive halving, then
    all-gather by recursive doubling:

        T = 2 ceil(log2 p) alpha + 2 (p - 1) / p * n beta

    (Thakur, Rabenseifner & Gropp 2005; exact for p a power of two, the
    non-power-of-two fix-up steps are not counted). Ring bandwidth with
    logarithmic latency; the inter-server algorithm of Goyal et al. 2017.
    """
    if p <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * alpha + 2 * (p - 1) / p * n * beta


def hierarchical_allreduce(n, nodes, per_node, alpha_intra, beta_intra, alpha_inter, beta_node):
    """Hierarchical ring all-reduce over `nodes` nodes of `per_node` devices:
    reduce-scatter inside each node (ring of g = per_node), ring all-reduce
    of each device's n / g shard across the m = nodes nodes (the g shards
    travel at once and share the node's network link, beta_node seconds per
    byte of the whole node), all-gather inside each node:

        T = 2 (g - 1) alpha_intra + 2 (g - 1) / g * n beta_intra
          + 2 (m - 1) alpha_inter + 2 (m - 1) / m * (n / g) * g beta_node

    The node link carries 2 (m - 1) / m n bytes however many devices the
    node has. The hierarchical all-reduce of Jia et al. 2018
    (arXiv:1807.11205), here with NCCL-style reduce-scatter / all-gather
    inside the node.
    """
    g, m = per_node, nodes
    intra = ring_allreduce(n, g, alpha_intra, beta_intra)
    inter = 2 * (m - 1) * alpha_inter + 2 * (m - 1) / m * n * beta_node if m > 1 else 0.0
    return intra + inter


def torus2d_allreduce(n, x, y, alpha_x, beta_x, alpha_y, beta_y):
    """2D-torus all-reduce over an x-by-y grid (Mikami et al. 2018,
    arXiv:1811.05233; Ying et al. 2018, arXiv:1811.06992): reduce-scatter
    along the x ("horizontal") rings, all-reduce of the n / x shards along
    the y ("vertical") rings, all-gather along the x rings:

        T = 2 (x - 1) alpha_x + 2 (x - 1) / x * n beta_x
          + 2 (y - 1) alpha_y + 2 (y - 1) / y * (n / x) beta_y

    2 (x - 1) + 2 (y - 1) messages instead of the flat ring's 2 (xy - 1).
    beta_y is per byte of one vertical ring; when the x rings of one node
    share its network link, pass x times the node's seconds per byte (then
    this equals `hierarchical_allreduce` with x = devices per node).
    """
    horizontal = ring_allreduce(n, x, alpha_x, beta_x)
    vertical = 2 * (y - 1) * alpha_y + 2 * (y - 1) / y * (n / x) * beta_y if y > 1 else 0.0
    return horizontal + vertical


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Devices, their grouping into nodes, and the links (SI units).

    intra_bandwidth: bytes/s between two devices of a node (one direction);
    inter_bandwidth: bytes/s of one node's network link, shared by its
    devices; latencies in seconds per message.
    """

    devices: int
    devices_per_node: int
    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float
    algorithm: str = "hierarchical"
    torus_x: int = 0  # 0: devices_per_node when > 1, else the squarest grid

    @property
    def nodes(self):
        return self.devices // self.devices_per_node


def torus_shape(devices, devices_per_node, torus_x=0):
    """(x, y) of the 2D-torus grid: `torus_x` if given, else x = devices
    per node (rows are nodes) or, with one device per node, the largest
    divisor of `devices` not above its square root."""
    if torus_x:
        return torus_x, devices // torus_x
    if devices_per_node > 1:
        return devices_per_node, devices // devices_per_node
    x = max(d for d in range(1, math.isqrt(devices) + 1) if devices % d == 0)
    return x, devices // x


def allreduce_time(n, cluster):
    """Seconds to all-reduce n bytes over `cluster` with its algorithm.

    Flat algorithms (ring, tree, halving_doubling) on one node use the
    intra-node link. Across nodes every message pays the inter-node
    latency and the slower of the two links: the ring has one flow per node
    on the network link (the ring enters and leaves each node once), tree
    and halving-doubling have all g devices of a node sending at once (each
    gets 1/g of the node's link).
    """
    c = cluster
    g, m, p = c.devices_per_node, c.nodes, c.devices
    beta_intra, beta_node = 1 / c.intra_bandwidth, 1 / c.inter_bandwidth
    if c.algorithm == "hierarchical":
        return hierarchical_allreduce(
            n, m, g, c.intra_latency, beta_intra, c.inter_latency, beta_node
        )
    if c.algorithm == "torus2d":
        x, y = torus_shape(p, g, c.torus_x)
        if g > 1:  # x = g: the rows are nodes, the columns share the node link
            return torus2d_allreduce(
                n, x, y, c.intra_latency, beta_intra, c.inter_latency, x * beta_node
            )
        return torus2d_allreduce(n, x, y, c.inter_latency, beta_node, c.inter_latency, beta_node)
    if m == 1:
        alpha, beta = c.intra_latency, beta_intra
    elif c.algorithm == "ring":
        alpha, beta = c.inter_latency, max(beta_intra, beta_node)
    else:
        alpha, beta = c.inter_latency, max(beta_intra, g * beta_node)
    flat = {
        "ring": ring_allreduce,
        "tree": tree_allreduce,
        "halving_doubling": halving_doubling_allreduce,
    }[c.algorithm]
    return flat(n, p, alpha, beta)


def exposed_communication(communication, backward, overlap):
    """The part of the all-reduce that the step waits for: with overlap the
    gradients are reduced while the backward pass still runs (bucketed, as
    Horovod / DDP do), so up to `backward` seconds are hidden:
    max(0, communication - backward); without overlap all of it."""
    return max(0.0, communication - backward) if overlap else communication


# --- the model -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LayerProfile:
    """One layer, per image: trainable parameters, forward FLOPs, and the
    elements of its inputs and of its output."""

    name: str
    kind: str
    parameters: int
    forward_flops: int
    input_elements: int
    output_elements: int


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    name: str
    layers: tuple

    @property
    def parameters(self):
        return sum(layer.parameters for layer in self.layers)

    @property
    def forward_flops(self):
        return sum(layer.forward_flops for layer in self.layers)

    def image_seconds(self, peak_flops, memory_bandwidth=0.0, activation_bytes=4):
        """Roofline seconds of one trained image at 100% of the device:
        sum over layers of max(3 F / peak, 3 (inputs + outputs) s_a / M)."""
        total = 0.0
        for layer in self.layers:
            seconds = TRAINING_FLOPS_FACTOR * layer.forward_flops / peak_flops
            if memory_bandwidth:
                moved = TRAINING_FLOPS_FACTOR * (layer.input_elements + layer.output_elements)
                seconds = max(seconds, moved * activation_bytes / memory_bandwidth)
            total += seconds
        return total


def _elements(shape):
    return math.prod(int(d) for d in shape[1:])


def _forward_flops(layer):
    import keras

    if isinstance(layer, keras.layers.Conv2D):  # DepthwiseConv2D is not a Conv2D
        kh, kw, cin_per_group, cout = layer.kernel.shape
        height, width = layer.output.shape[1:3]
        return 2 * kh * kw * cin_per_group * cout * height * width
    if isinstance(layer, keras.layers.Dense):
        fan_in, units = layer.kernel.shape
        return 2 * fan_in * units
    return 0


def profile_keras_model(model):
    """The ModelProfile of a built functional Keras model (layers in order,
    the input layer left out)."""
    import keras

    layers = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        inputs = layer.input if isinstance(layer.input, (list, tuple)) else [layer.input]
        layers.append(
            LayerProfile(
                name=layer.name,
                kind=type(layer).__name__,
                parameters=sum(math.prod(w.shape) for w in layer.trainable_weights),
                forward_flops=int(_forward_flops(layer)),
                input_elements=sum(_elements(t.shape) for t in inputs),
                output_elements=_elements(layer.output.shape),
            )
        )
    return ModelProfile(model.name, tuple(layers))


@functools.cache
def model_profile(name, image_size=224, num_classes=1000):
    """Builds keras_lars.models.<name> on the CPU and profiles it."""
    import keras

    from keras_lars import models

    with keras.device("cpu:0"):
        model = getattr(models, name)(
            num_classes=num_classes, input_shape=(image_size, image_size, 3)
        )
    return profile_keras_model(model)


def custom_profile(parameters, forward_flops, name="custom"):
    """A model given by its totals only (one pseudo-layer, no activations)."""
    layer = LayerProfile(name, "given", int(parameters), int(forward_flops), 0, 0)
    return ModelProfile(name, (layer,))


# --- one step and the whole run --------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Device:
    """A device's training speed: `images_per_second` (measured), or
    `peak_flops` x `utilization` with an optional `memory_bandwidth`
    (bytes/s) for the roofline."""

    peak_flops: float = 0.0
    utilization: float = 1.0
    memory_bandwidth: float = 0.0
    activation_bytes: int = 4
    images_per_second: float = 0.0
    input_images_per_second: float = 0.0  # the input pipeline's rate; 0: unlimited

    def compute_seconds(self, profile, images):
        if self.images_per_second:
            return images / self.images_per_second
        seconds = profile.image_seconds(
            self.peak_flops, self.memory_bandwidth, self.activation_bytes
        )
        return images * seconds / self.utilization


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Seconds of one step and its parts (see the module docstring)."""

    compute: float
    communication: float
    exposed_communication: float
    input: float

    @property
    def step(self):
        return self.compute + self.exposed_communication + self.input

    @property
    def efficiency(self):
        return self.compute / self.step


def step_time(profile, global_batch, device, cluster, gradient_bytes=4, overlap=True):
    """The StepTime of one data-parallel step of `global_batch` images."""
    per_device = global_batch / cluster.devices
    compute = device.compute_seconds(profile, per_device)
    communication = allreduce_time(profile.parameters * gradient_bytes, cluster)
    exposed = exposed_communication(communication, BACKWARD_FRACTION * compute, overlap)
    stall = 0.0
    if device.input_images_per_second:
        stall = max(0.0, per_device / device.input_images_per_second - compute - exposed)
    return StepTime(compute, communication, exposed, stall)


def recipe_epochs(global_batch):
    """The epochs keras_lars.resnet50_lars_recipe gives the batch."""
    return float(resnet50_lars_recipe(global_batch).train_epochs)


@dataclasses.dataclass(frozen=True)
class Run:
    step: StepTime
    steps: int
    epochs: float

    @property
    def seconds(self):
        return self.steps * self.step.step


def plan_run(
    profile,
    global_batch,
    epochs,
    device,
    cluster,
    gradient_bytes=4,
    overlap=True,
    examples=IMAGENET_TRAIN_EXAMPLES,
):
    """Step time, steps and time to train `epochs` (0: the recipe's) of
    `examples` examples an epoch (drop remainder)."""
    epochs = epochs or recipe_epochs(global_batch)
    step = step_time(profile, global_batch, device, cluster, gradient_bytes, overlap)
    return Run(step, epochs_to_steps(epochs, examples, global_batch), epochs)


# --- data or model parallelism, layer by layer (Krizhevsky 2014) -------------------------
@dataclasses.dataclass(frozen=True)
class LayerChoice:
    """Bytes one step moves for a layer under each scheme, global batch B:

    data parallelism: the layer's gradient, reduce-scattered and
        all-gathered, 2 P s_g (P parameters, s_g bytes each);
    model parallelism (the layer split across devices, Krizhevsky 2014,
        "One weird trick", arXiv:1404.5997): every device needs the whole
        batch's input activations forward and sends their gradients back,
        2 B I s_a (I input elements per image, s_a bytes each).

    Model parallelism is cheaper below the break-even batch P s_g / (I s_a).
    """

    layer: LayerProfile
    global_batch: int
    gradient_bytes: int = 4
    activation_bytes: int = 4

    @property
    def data_parallel_bytes(self):
        return 2 * self.layer.parameters * self.gradient_bytes

    @property
    def model_parallel_bytes(self):
        return 2 * self.global_batch * self.layer.input_elements * self.activation_bytes

    @property
    def cheaper(self):
        return "model" if self.model_parallel_bytes < self.data_parallel_bytes else "data"

    @property
    def break_even_batch(self):
        return (
            self.layer.parameters
            * self.gradient_bytes
            / (self.layer.input_elements * self.activation_bytes)
        )


def layer_choices(profile, global_batch, gradient_bytes=4, activation_bytes=4):
    """A LayerChoice for every layer with parameters and FLOPs (conv, dense)."""
    return [
        LayerChoice(layer, global_batch, gradient_bytes, activation_bytes)
        for layer in profile.layers
        if layer.parameters and layer.forward_flops and layer.input_elements
    ]


# --- published records -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Record:
    """A published ImageNet / ResNet-50 training time and the hardware figures
    its paper gives (SI units). `verified`: where each figure was checked;
    `unverified`: figures taken as assumptions; `miss`: why the prediction
    is off, when it is."""

    key: str
    paper: str
    devices: int
    devices_per_node: int
    device: str
    peak_flops: float
    memory_bandwidth: float
    activation_dtype: str
    intra_bandwidth: float
    inter_bandwidth: float
    algorithm: str
    gradient_dtype: str
    global_batch: int
    epochs: float
    published_seconds: float
    verified: str
    unverified: str
    miss: str = ""
    intra_latency: float = 5 * US  # assumed for every record, not from the papers
    inter_latency: float = 5 * US
    overlap: bool = False  # where the paper does not say (the conservative reading)

    def cluster(self):
        return Cluster(
            self.devices,
            self.devices_per_node,
            self.intra_bandwidth,
            self.intra_latency,
            self.inter_bandwidth,
            self.inter_latency,
            self.algorithm,
        )

    def device_model(self, utilization):
        return Device(
            peak_flops=self.peak_flops,
            utilization=utilization,
            memory_bandwidth=self.memory_bandwidth,
            activation_bytes=DTYPE_BYTES[self.activation_dtype],
        )


RECORDS = (
    Record(
        key="goyal2017",
        paper="Goyal et al. 2017, arXiv:1706.02677",
        devices=256,
        devices_per_node=8,
        device="P100",
        peak_flops=10.6e12,
        memory_bandwidth=732 * GB,
        activation_dtype="float32",
        intra_bandwidth=20 * GB,
        inter_bandwidth=50e9 / 8,
        algorithm="hierarchical",
        gradient_dtype="float32",
        global_batch=8192,
        epochs=90,
        published_seconds=3600,
        overlap=True,
        verified="From the paper's full text (arXiv:1706.02677v2): 256 GPUs, 32 servers x "
        "8 P100 joined by NVLink (sec. 4.1 p.5, sec. 4.3 p.6, footnote 2); 50 Gbit Ethernet "
        "(sec. 4.3 p.6); batch 8k = 32 x 256 (sec. 5.2 p.7); 90 epochs (sec. 5.1 p.6); one "
        "hour (abstract, sec. 5); FP32 gradients, 100 MB a step (sec. 4.3); the all-reduce "
        "overlaps backprop (sec. 4 p.5, Fig. 8). P100 SXM2 10.6 TFLOP/s FP32, 732 GB/s, "
        "NVLink 20 GB/s (Big Basin OCP slides; Dell EMC P100 blog).",
        unverified="The hour's precision ('one hour'); the P100 peaks and NVLink bandwidth "
        "(not in the paper); the all-reduce is modelled as a hierarchical ring, while the "
        "paper reduces and broadcasts inside a server and runs recursive halving/doubling "
        "between servers (sec. 4.1): the same bandwidth term, 10 latency terms instead of 62.",
    ),
    Record(
        key="goyal2017_8gpu",
        paper="Goyal et al. 2017, arXiv:1706.02677 (baseline)",
        devices=8,
        devices_per_node=8,
        device="P100",
        peak_flops=10.6e12,
        memory_bandwidth=732 * GB,
        activation_dtype="float32",
        intra_bandwidth=20 * GB,
        inter_bandwidth=50e9 / 8,
        algorithm="hierarchical",
        gradient_dtype="float32",
        global_batch=256,
        epochs=90,
        published_seconds=29 * 3600,
        overlap=True,
        verified="29 hours on 8 P100 (sec. 1 p.1); 8 GPUs in one server at batch 256 = 8 x "
        "32 (sec. 5.1 p.7); 90 epochs (sec. 5.1); the all-reduce overlaps backprop (sec. 4).",
        unverified="The 29 hours stand in a sentence on the original ResNet-50 recipe; Fig. "
        "7 gives the baseline as 'over 16 minutes' an epoch (about 24 h for 90 epochs); "
        "NVLink 20 GB/s.",
    ),
    Record(
        key="akiba2017",
        paper="Akiba et al. 2017, arXiv:1711.04325",
        devices=1024,
        devices_per_node=8,
        device="P100",
        peak_flops=10.6e12,
        memory_bandwidth=732 * GB,
        activation_dtype="float32",
        intra_bandwidth=10 * GB,
        inter_bandwidth=2 * 56e9 / 8,
        algorithm="ring",
        gradient_dtype="float32",
        global_batch=32768,
        epochs=90,
        published_seconds=15 * 60,
        verified="1024 P100, 90 epochs, batch 32k, 15 minutes (abstract); MN-1: 128 nodes "
        "x 8 P100, two FDR InfiniBand links (56 Gbps x 2) per node, ring all-reduce (PFN "
        "blog 'MN-1: a GPU cluster behind 15-min ImageNet', 2017).",
        unverified="P100 SXM2 peaks (as Goyal); intra-node link 10 GB/s; FP32 gradients "
        "(the paper may reduce in FP16).",
    ),
    Record(
        key="you2018",
        paper="You et al. 2018 (ICPP), arXiv:1709.05011",
        devices=2048,
        devices_per_node=1,
        device="Xeon Phi 7250",
        peak_flops=68 * 1.4e9 * 2 * 16 * 2,
        memory_bandwidth=450 * GB,
        activation_dtype="float32",
        intra_bandwidth=12.5 * GB,
        inter_bandwidth=100e9 / 8,
        algorithm="ring",
        gradient_dtype="float32",
        global_batch=32768,
        epochs=90,
        published_seconds=20 * 60,
        verified="2048 Xeon Phi 7250, 90 epochs, 20 minutes, LARS (abstract); KNL 7250: 68 "
        "cores at 1.4 GHz, two 512-bit vector units a core (Cornell Virtual Workshop, "
        "Stampede2), FMA: 6.09 TFLOP/s FP32; MCDRAM above 450 GB/s (JLab Xeon Phi page).",
        unverified="batch 32K for the 20-minute run; Stampede2's Omni-Path 100 Gb/s as the "
        "network; the all-reduce algorithm (ring assumed).",
    ),
    Record(
        key="jia2018",
        paper="Jia et al. 2018, arXiv:1807.11205",
        devices=2048,
        devices_per_node=8,
        device="P40",
        peak_flops=11.76e12,
        memory_bandwidth=346 * GB,
        activation_dtype="float16",
        intra_bandwidth=12 * GB,
        inter_bandwidth=100e9 / 8,
        algorithm="hierarchical",
        gradient_dtype="float16",
        global_batch=65536,
        epochs=90,
        published_seconds=6.6 * 60,
        verified="2048 P40, 90 epochs, 6.6 minutes, batch up to 64k, mixed precision "
        "(abstract; batch 64K in Mikami et al.'s table); 100 Gbit Ethernet (Mikami et al.'s "
        "table); hierarchical ring all-reduce (cited as Tencent 2018 in Huang et al. "
        "2024, Gloo+); P40: 11.76 TFLOP/s FP32, 1/64-rate FP16, 346 GB/s, PCIe 3.0 x16 "
        "(spec pages).",
        unverified="8 GPUs per node; FP16 all-reduce and FP16 activations with FP32 "
        "arithmetic (the P40's FP16 math is slow).",
    ),
    Record(
        key="mikami2018",
        paper="Mikami et al. 2018 (v1), arXiv:1811.05233",
        devices=2176,
        devices_per_node=4,
        device="V100",
        peak_flops=125e12,
        memory_bandwidth=900 * GB,
        activation_dtype="float16",
        intra_bandwidth=50 * GB,
        inter_bandwidth=2 * 100e9 / 8,
        algorithm="torus2d",
        gradient_dtype="float16",
        global_batch=69632,
        epochs=90,
        published_seconds=224,
        verified="224 seconds, 2D-torus all-reduce, ABCI (abstract v1); 2176 V100, batch "
        "34K->68K, InfiniBand EDR x2 (the paper's tables via NVIDIA's news post); 'up to 2176 "
        "GPUs', batch and GPU count adjusted during training (Sony announcement, ITmedia "
        "2018-11-13); V100 125 tensor TFLOP/s (NVIDIA), 900 GB/s HBM2.",
        unverified="90 epochs; 4 GPUs per node (ABCI); the precision; the batch schedule "
        "(68K = 69632 used throughout).",
        miss="Predicted too fast: the batch (34K->68K) and the number of GPUs (up to "
        "2176) grew during the run, which one fixed 2176-GPU, 68K plan cannot follow; the "
        "published time implies ~240 images/s a V100, 40% of the utilization of the "
        "calibration, where Yamazaki et al. reach 845 on the same machine.",
    ),
    Record(
        key="ying2018",
        paper="Ying et al. 2018, arXiv:1811.06992",
        devices=1024,
        devices_per_node=1,
        device="TPU v3",
        peak_flops=123e12,
        memory_bandwidth=900 * GB,
        activation_dtype="bfloat16",
        intra_bandwidth=340e12 / 1024,
        inter_bandwidth=340e12 / 1024,
        algorithm="torus2d",
        gradient_dtype="float32",
        global_batch=32768,
        epochs=90,
        published_seconds=2.2 * 60,
        verified="1024 TPU v3 chips, 2.2 minutes, >1.05M images/s, 2-D torus all-reduce "
        "(abstract); 123 TFLOP/s bf16 and 900 GB/s a chip, 340 TB/s all-reduce bandwidth "
        "a pod (Google Cloud TPU v3 documentation).",
        unverified="batch 32K and 90 epochs (1.05M images/s x 2.2 min = 108 epochs, so "
        "the time includes more than training steps); FP32 gradient sums; whether the "
        "all-reduce overlapped the backward pass (off assumed).",
        miss="Predicted too slow: the published 2.2 minutes need a utilization of 0.58, "
        "where the FP32 P100s of the calibration reach 0.42: bfloat16 on the TPU's matrix "
        "units runs ResNet-50 nearer its peak, which one global constant cannot carry. "
        "With the all-reduce overlapped (not known) it is +34%, still a miss.",
    ),
    Record(
        key="yamazaki2019",
        paper="Yamazaki et al. 2019, arXiv:1903.12650",
        devices=2048,
        devices_per_node=4,
        device="V100",
        peak_flops=125e12,
        memory_bandwidth=900 * GB,
        activation_dtype="float16",
        intra_bandwidth=50 * GB,
        inter_bandwidth=2 * 100e9 / 8,
        algorithm="hierarchical",
        gradient_dtype="float16",
        global_batch=81920,
        epochs=90,
        published_seconds=74.7,
        overlap=True,
        verified="2048 GPUs on ABCI, 74.7 s, >1.73M images/s (abstract); V100, batch "
        "81,920, Tensor Cores / mixed precision, MXNet, LARS (NVIDIA blog on the paper); "
        "ABCI InfiniBand EDR x2 (Mikami et al.'s table).",
        unverified="90 epochs (1.73M images/s x 74.7 s = 101 epochs); 4 GPUs per node and "
        "the overlap of all-reduce with the backward pass (both from 机器之心's Chinese "
        "translation of the paper, not its English text); the all-reduce algorithm "
        "(hierarchical assumed); FP16 gradients.",
    ),
)
CALIBRATION_RECORD = "goyal2017"
CALIBRATED_UTILIZATION = 0.417  # fit_utilization(record(CALIBRATION_RECORD)), 3 digits
TOLERANCE = 0.30


def record(key):
    return next(r for r in RECORDS if r.key == key)


def predict_record(rec, utilization=CALIBRATED_UTILIZATION):
    """The Run this planner predicts for a record's hardware (ResNet-50)."""
    return plan_run(
        model_profile("resnet50"),
        rec.global_batch,
        rec.epochs,
        rec.device_model(utilization),
        rec.cluster(),
        DTYPE_BYTES[rec.gradient_dtype],
        rec.overlap,
    )


def fit_utilization(rec):
    """The utilization at which the prediction of `rec` equals its
    published time (bisection; the predicted time falls as utilization
    rises)."""
    low, high = 1e-4, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if predict_record(rec, middle).seconds > rec.published_seconds:
            low = middle
        else:
            high = middle
    return (low + high) / 2


# --- settings ------------------------------------------------------------------------------
def _required_for_custom(value, config):
    if config.model == "custom" and not value:
        return "is required (> 0) with --model=custom"
    return None


def _divides_devices(value, config):
    if config.devices % value:
        return f"must divide --devices ({config.devices})"
    return None


def _torus_x(value, config):
    if not value:
        return None
    if config.algorithm != "torus2d":
        return "is only used with --algorithm=torus2d"
    if config.devices % value:
        return f"must divide --devices ({config.devices})"
    if config.devices_per_node > 1 and value != config.devices_per_node:
        return "must be --devices_per_node (or 0) when nodes hold several devices"
    return None


def _batch(value, config):
    if value < config.devices:
        return f"must be >= --devices ({config.devices}): at least one image a device"
    return None


def _device_speed(value, config):
    if not value and not config.images_per_second:
        return "must be > 0 unless --images_per_second is given"
    return None


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """The inputs of keras-lars-plan (defaults: ResNet-50, 64 V100-class
    devices in nodes of 8, mixed precision)."""

    model: str = setting(
        "resnet50",
        "Network: a keras_lars.models name (parameters, FLOPs and activations counted on "
        "its Keras definition) or custom (give --parameters and --forward_gflops).",
        choices=MODELS,
    )
    image_size: int = setting(224, "Training image side.", check=at_least(7))
    parameters: int = setting(
        0, "Trainable parameters of a custom model.", check=_required_for_custom
    )
    forward_gflops: float = setting(
        0.0,
        "Forward GFLOPs per image of a custom model (multiply-add = 2).",
        check=_required_for_custom,
    )
    devices: int = setting(64, "Devices (data-parallel replicas).", check=at_least(1))
    devices_per_node: int = setting(
        8, "Devices per node (they share the node's network link).", check=_divides_devices
    )
    images_per_second: float = setting(
        0.0,
        "Measured training images/s of one device; 0: --peak_tflops x --utilization.",
        check=at_least(0.0),
    )
    peak_tflops: float = setting(
        125.0,
        "Peak TFLOP/s of one device at the arithmetic the run uses.",
        check=_device_speed,
    )
    memory_bandwidth: float = setting(
        900.0,
        "Device memory GB/s for the per-layer roofline; 0: FLOPs only.",
        check=at_least(0.0),
    )
    utilization: float = setting(
        CALIBRATED_UTILIZATION,
        f"Fraction of the roofline a device achieves (default: fitted on {CALIBRATION_RECORD}).",
        check=lambda value, config: None if 0 < value <= 1 else "must be in (0, 1]",
    )
    activation_dtype: str = setting(
        "float16", "Bytes of activations in device memory.", choices=tuple(DTYPE_BYTES)
    )
    input_images_per_second: float = setting(
        0.0,
        "Input-pipeline images/s per device; 0: never the bottleneck.",
        check=at_least(0.0),
    )
    intra_node_bandwidth: float = setting(
        50.0, "GB/s between two devices of a node.", check=greater_than(0.0)
    )
    intra_node_latency_us: float = setting(
        5.0, "Microseconds per message inside a node.", check=at_least(0.0)
    )
    inter_node_bandwidth: float = setting(
        12.5, "GB/s of one node's network link (100 Gb/s = 12.5).", check=greater_than(0.0)
    )
    inter_node_latency_us: float = setting(
        5.0, "Microseconds per message between nodes.", check=at_least(0.0)
    )
    algorithm: str = setting(
        "hierarchical", "All-reduce algorithm (see the module docstring).", choices=ALGORITHMS
    )
    torus_x: int = setting(
        0,
        "Width of the 2D-torus grid; 0: devices per node, or the squarest grid.",
        check=_torus_x,
    )
    gradient_dtype: str = setting(
        "float32", "Bytes per gradient element in the all-reduce.", choices=tuple(DTYPE_BYTES)
    )
    overlap: bool = setting(True, "All-reduce overlaps the backward pass.")
    global_batch_size: int = setting(8192, "Images per step over all devices.", check=_batch)
    epochs: float = setting(
        0.0,
        "Epochs to train; 0: keras_lars.resnet50_lars_recipe's for the batch.",
        check=at_least(0.0),
    )
    examples: int = setting(
        IMAGENET_TRAIN_EXAMPLES, "Training examples in one epoch.", check=at_least(1)
    )
    layers: bool = setting(False, "Print the per-layer data- vs model-parallel report.")
    records: bool = setting(False, "Print the published records against the predictions.")

    def __post_init__(self):
        settings.check(self)
        if self.global_batch_size > self.examples:
            raise ConfigError(
                f"--global_batch_size={self.global_batch_size}: must be <= --examples "
                f"({self.examples})."
            )

    def profile(self):
        if self.model == "custom":
            return custom_profile(self.parameters, self.forward_gflops * 1e9)
        return model_profile(self.model, self.image_size)

    def device(self):
        return Device(
            peak_flops=self.peak_tflops * 1e12,
            utilization=self.utilization,
            memory_bandwidth=self.memory_bandwidth * GB,
            activation_bytes=DTYPE_BYTES[self.activation_dtype],
            images_per_second=self.images_per_second,
            input_images_per_second=self.input_images_per_second,
        )

    def cluster(self, devices=None):
        devices = devices or self.devices
        return Cluster(
            devices,
            min(self.devices_per_node, devices),
            self.intra_node_bandwidth * GB,
            self.intra_node_latency_us * US,
            self.inter_node_bandwidth * GB,
            self.inter_node_latency_us * US,
            self.algorithm,
            self.torus_x if devices == self.devices else 0,
        )

    def run(self, global_batch=None, devices=None):
        return plan_run(
            self.profile(),
            global_batch or self.global_batch_size,
            self.epochs,
            self.device(),
            self.cluster(devices),
            DTYPE_BYTES[self.gradient_dtype],
            self.overlap,
            self.examples,
        )


# --- output ---------------------------------------------------------------------------------
def duration(seconds):
    """'42 s', '12.5 min', '3.2 h' or '4.1 d'."""
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _ms(seconds):
    return f"{seconds * 1e3:9.1f} ms"


def plan_text(options):
    """The report of one plan: model, step split, efficiency, time to train."""
    profile, run = options.profile(), options.run()
    step, cluster = run.step, options.cluster()
    gradient_bytes = profile.parameters * DTYPE_BYTES[options.gradient_dtype]
    per_device = options.global_batch_size / options.devices
    if options.images_per_second:
        speed = f"{options.images_per_second:g} images/s measured"
    else:
        speed = (
            f"{options.peak_tflops:g} TFLOP/s peak, {options.memory_bandwidth:g} GB/s, "
            f"utilization {options.utilization:g}"
        )
    lines = [
        f"model     {profile.name}: {profile.parameters:,} parameters "
        f"({gradient_bytes / 1e6:.1f} MB of {options.gradient_dtype} gradients), "
        f"{profile.forward_flops / 1e9:.2f} GFLOPs forward per image",
        f"device    {speed}",
        f"cluster   {options.devices} devices = {cluster.nodes} "
        f"node{'s' if cluster.nodes > 1 else ''} x {cluster.devices_per_node}, "
        f"{options.algorithm} all-reduce, "
        f"overlap {'on' if options.overlap else 'off'}",
        f"step      batch {options.global_batch_size:,} ({per_device:g} a device)",
        f"  compute               {_ms(step.compute)}",
        f"  communication         {_ms(step.communication)}  "
        f"(exposed {step.exposed_communication * 1e3:.1f} ms)",
        f"  input stall           {_ms(step.input)}",
        f"  step                  {_ms(step.step)}",
        f"scaling efficiency      {step.efficiency:9.1%}",
        f"steps                   {run.steps:9,}  ({run.epochs:g} epochs of "
        f"{options.examples:,} examples)",
        f"time to train           {duration(run.seconds):>9}",
    ]
    return "\n".join(lines)


def neighbourhood(value, factors=(0.25, 0.5, 1, 2, 4)):
    return [max(1, round(value * f)) for f in factors]


def grid_text(options):
    """Time to train for batch x devices around the given point (epochs:
    --epochs, else the recipe's for each batch; '-' where a device would
    get less than one image or the devices do not fill whole nodes)."""
    batches = neighbourhood(options.global_batch_size)
    devices = neighbourhood(options.devices)
    epochs = "" if options.epochs else ", the recipe's epochs for each batch"
    lines = [f"time to train, global batch (rows) x devices (columns){epochs}:"]
    lines.append(f"{'':>9}" + "".join(f"{d:>11,}" for d in devices))
    for batch in batches:
        cells = []
        for count in devices:
            nodes_ok = count % min(options.devices_per_node, count) == 0
            if batch < count or batch > options.examples or not nodes_ok:
                cells.append(f"{'-':>11}")
                continue
            cells.append(f"{duration(options.run(batch, count).seconds):>11}")
        lines.append(f"{batch:>9,}" + "".join(cells))
    return "\n".join(lines)


def layers_text(options):
    """The per-layer report: bytes a step under data vs model parallelism."""
    profile = options.profile()
    choices = layer_choices(
        profile,
        options.global_batch_size,
        DTYPE_BYTES[options.gradient_dtype],
        DTYPE_BYTES[options.activation_dtype],
    )
    lines = [
        f"per layer, batch {options.global_batch_size:,}: data parallel = gradient "
        "all-reduce 2 P s_g; model parallel = activations in and their gradients back "
        "2 B I s_a (Krizhevsky 2014)",
        f"{'layer':<28}{'parameters':>12}{'data MB':>10}{'model MB':>11}"
        f"{'cheaper':>9}{'break-even batch':>18}",
    ]
    for c in choices:
        lines.append(
            f"{c.layer.name:<28}{c.layer.parameters:>12,}{c.data_parallel_bytes / 1e6:>10.1f}"
            f"{c.model_parallel_bytes / 1e6:>11.1f}{c.cheaper:>9}{c.break_even_batch:>18,.0f}"
        )
    return "\n".join(lines)


def records_rows(utilization=CALIBRATED_UTILIZATION):
    """(record, predicted seconds, relative error) for every record."""
    rows = []
    for rec in RECORDS:
        predicted = predict_record(rec, utilization).seconds
        rows.append((rec, predicted, predicted / rec.published_seconds - 1))
    return rows


def records_text():
    """The records table; `fit u`: the utilization that would reproduce the
    published time (the calibration's is the constant itself)."""
    lines = [
        f"ResNet-50 / ImageNet: published vs predicted from the papers' hardware "
        f"(utilization {CALIBRATED_UTILIZATION} fitted on {CALIBRATION_RECORD}; "
        f"tolerance +-{TOLERANCE:.0%})",
        f"{'record':<16}{'hardware':<20}{'batch':>8}{'published':>11}{'predicted':>11}"
        f"{'error':>7}{'fit u':>7}  note",
    ]
    for rec, predicted, error in records_rows():
        if rec.key == CALIBRATION_RECORD:
            note = "calibration"
        elif abs(error) <= TOLERANCE:
            note = "ok"
        else:
            note = "MISS: " + rec.miss
        lines.append(
            f"{rec.key:<16}{f'{rec.devices} {rec.device}':<20}{rec.global_batch:>8,}"
            f"{duration(rec.published_seconds):>11}{duration(predicted):>11}"
            f"{error:>+7.0%}{fit_utilization(rec):>7.3f}  {note}"
        )
    lines.append("90 epochs each; sources and unverified figures: docs/planning.md")
    return "\n".join(lines)


def records_markdown():
    """The records table as Markdown (docs/planning.md holds it; a test
    checks that the page is current)."""
    lines = [
        "| record | paper | hardware | batch | published | predicted | error | fit u |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rec, predicted, error in records_rows():
        error_text = "calibration" if rec.key == CALIBRATION_RECORD else f"{error:+.0%}"
        if rec.key != CALIBRATION_RECORD and abs(error) > TOLERANCE:
            error_text = f"**{error:+.0%} (miss)**"
        lines.append(
            f"| `{rec.key}` | {rec.paper} | {rec.devices} {rec.device} | "
            f"{rec.global_batch:,} | {duration(rec.published_seconds)} | "
            f"{duration(predicted)} | {error_text} | {fit_utilization(rec):.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    options = settings.options_from_flags(PlanSettings)
    if options.records:
        print(records_text())
        return
    print(plan_text(options))
    print()
    print(grid_text(options))
    if options.layers:
        print()
        print(layers_text(options))


def run(argv=None):
    """The keras-lars-plan entry point."""
    settings.define_flags(PlanSettings)
    app.run(main, argv)


if __name__ == "__main__":
    run()
