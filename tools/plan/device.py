"""What one device spends on one trained image: the model's per-layer
profile, its roofline time, and the device's speed.

    t_image = sum over layers l of max(3 F_l / P, A_l s_a / M)
    compute = b * t_image / u        (or b / rate, a measured images/s)

F_l: layer l's forward FLOPs per image (a multiply-add counts 2): a
convolution 2 kh kw (cin / groups) cout Hout Wout, a dense layer 2 in out,
other layers 0. Training costs 3x the forward pass (the backward pass
computes the gradients of the inputs and of the weights, 2x). A_l: the
elements layer l reads and writes in one trained image, s_a bytes each, as
XLA fuses a training step (`moved_elements`; I, O: the layer's input and
output elements):

    convolution, dense, pooling   3 (I + O)  forward reads I, writes O; backward
                                             reads O's gradient and I, writes I's
    batch norm (+ its ReLU)       8 O        forward: the statistics read O, one
        fused elementwise pass normalizes, scales, shifts and applies the
        ReLU (read O, write O); backward: one fused reduction reads the output
        gradient and O for the two sums, one elementwise pass reads both and
        writes the input gradient (1 + 2 + 2 + 3)
    ReLU after a conv, dense,     0          in its producer's elementwise pass
        batch norm or add                    (its mask in the same backward pass)
    residual add                  2 O        the second operand read into the
                                             fused pass, its gradient read once
    zero padding, flatten         0          XLA folds a pad into the window of
                                             the convolution or pooling it feeds;
                                             a reshape is a bitcast
    anything else                 3 (I + O)

Counted one layer a pass, ResNet-50's batch norm, ReLU, add and padding
moved 12 O, 9 O and 6 (I + O) per group and ran 63% of a V100's float16
roofline; fused they move 8 O and 2 O. P: peak FLOP/s at the arithmetic the
run uses; M: memory bandwidth (0: FLOPs only); u: utilization. Each layer
takes the longer of its compute and memory times, a roofline (Williams,
Waterman & Patterson 2009, "Roofline", CACM 52(4)).

Profiles are counted on the Keras definitions of keras_lars.models, built on
the CPU: ResNet-50 has 25,557,032 trainable parameters and 4,089,184,256
multiply-adds per 224x224 image (8.18 GFLOPs forward, 24.5 per trained image).

A device's step (device.Device.step_seconds) adds what throughput
measurements at several batch sizes show (calibration.py):

    compute(b) = b * t_image / (u * e(b)),  e(b) = b / (b + b_half)
    step(b)    = compute(b) + c_fixed        (before communication)

e(b): how full the device is at b images (b_half: the batch at which it is
half full); c_fixed: seconds every step pays whatever its batch (the
optimizer's update, launches, the host). `DEVICES` declares each device
once: peaks, memory bandwidth, memory size, each with its source.
Importing this module imports no Keras: the profiles load it (the flags
need DEVICES first).
"""

import dataclasses
import functools
import math

TRAINING_FLOPS_FACTOR = 3  # forward + backward (2x forward)
BATCH_NORM_PASSES = 8  # over its output, its ReLU fused (module docstring)
RESIDUAL_ADD_PASSES = 2  # the second operand into the fused pass, its gradient
FOLDED = ("ZeroPadding2D", "Flatten")  # no pass of their own
FUSES_ACTIVATION = ("Conv2D", "Dense", "BatchNormalization", "Add")  # a following ReLU
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


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

    @functools.cache  # noqa: B019 (profiles are few and live for the run)
    def image_seconds(self, peak_flops, memory_bandwidth=0.0, activation_bytes=4):
        """Roofline seconds of one trained image at 100% of the device:
        sum over layers of max(3 F / peak, A s_a / M) (A: moved_elements)."""
        total, previous = 0.0, None
        for layer in self.layers:
            seconds = TRAINING_FLOPS_FACTOR * layer.forward_flops / peak_flops
            if memory_bandwidth:
                moved = moved_elements(layer, previous)
                seconds = max(seconds, moved * activation_bytes / memory_bandwidth)
            total += seconds
            previous = layer
        return total


def moved_elements(layer, previous=None):
    """Elements `layer` reads and writes in one trained image, fused as XLA
    fuses it (the module docstring's table); `previous`: the layer before it
    (its producer in these sequential profiles; None at a model's or a
    pipeline stage's start)."""
    if layer.kind in FOLDED:
        return 0
    if layer.kind == "ReLU" and previous is not None and previous.kind in FUSES_ACTIVATION:
        return 0
    if layer.kind == "BatchNormalization":
        return BATCH_NORM_PASSES * layer.output_elements
    if layer.kind == "Add":
        return RESIDUAL_ADD_PASSES * layer.output_elements
    return TRAINING_FLOPS_FACTOR * (layer.input_elements + layer.output_elements)


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
    """Builds keras_lars.models.BUILDERS[name] on the CPU, its variables
    uninitialised, and profiles it."""
    from keras_lars.models import BUILDERS  # before Keras: it loads it (keras_lars/_quiet.py)

    builder = BUILDERS[name]
    return profile_keras_model(_on_cpu(builder, num_classes, (image_size, image_size, 3)))


def _on_cpu(builder, num_classes, input_shape):
    """builder(num_classes=..., input_shape=...) built on the CPU for its
    shapes alone (no values drawn: shapes_only.built_shapes_only)."""
    import keras

    from keras_lars.tools.shapes_only import built_shapes_only

    with keras.device("cpu:0"):
        return built_shapes_only(lambda: builder(num_classes=num_classes, input_shape=input_shape))


def custom_profile(parameters, forward_flops, name="custom"):
    """A model given by its totals only (one pseudo-layer, no activations)."""
    layer = LayerProfile(name, "given", int(parameters), int(forward_flops), 0, 0)
    return ModelProfile(name, (layer,))


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """One accelerator as its vendor publishes it (SI units): peak FLOP/s by
    the arithmetic of the matrix units (`peak_flops[dtype]`, the dtype of
    the activations), memory bandwidth (bytes/s) and memory (bytes)."""

    name: str
    peak_flops: dict
    memory_bandwidth: float
    memory_bytes: float
    source: str

    def peak(self, dtype):
        """Peak FLOP/s for `dtype` activations (float16 and bfloat16 run on
        the same units where only one of them is listed)."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        half = {"float16": "bfloat16", "bfloat16": "float16"}.get(dtype)
        if half in self.peak_flops:
            return self.peak_flops[half]
        return self.peak_flops["float32"]


GIB = 2**30
DEVICES = {
    spec.name: spec
    for spec in (
        DeviceSpec(
            "P100-SXM2",
            {"float32": 10.6e12, "float16": 21.2e12},
            732e9,
            16e9,
            "10.6 TFLOP/s FP32, 732 GB/s (Big Basin OCP slides; Dell EMC's P100 blog); "
            "16 GB HBM2 and FP16 at twice FP32 (NVIDIA P100 datasheet)",
        ),
        DeviceSpec(
            "P100-PCIe",
            {"float32": 9.3e12, "float16": 18.7e12},
            732e9,
            16e9,
            "9.3 TFLOP/s FP32 (NVIDIA P100 datasheet, PCIe form; PFN's MN-1 used it); "
            "732 GB/s with 16 GB, 549 GB/s with 12 GB (same datasheet)",
        ),
        DeviceSpec(
            "P40",
            {"float32": 11.76e12},
            346e9,
            24e9,
            "11.76 TFLOP/s FP32, FP16 at 1/64 rate (so float16 runs on the FP32 "
            "units), 346 GB/s, 24 GB GDDR5 (NVIDIA P40 spec listings)",
        ),
        DeviceSpec(
            "Xeon Phi 7250",
            {"float32": 68 * 1.4e9 * 2 * 16 * 2},
            450e9,
            16e9,
            "68 cores at 1.4 GHz, two 512-bit FMA units a core: 6.09 TFLOP/s FP32 "
            "(Cornell Virtual Workshop, Stampede2); 16 GB MCDRAM above 450 GB/s (JLab)",
        ),
        DeviceSpec(
            "V100-SXM2-16GB",
            {"float32": 15.7e12, "float16": 125e12},
            900e9,
            16e9,
            "125 TFLOP/s tensor (NVIDIA 'Programming Tensor Cores'), 15.7 FP32 and "
            "900 GB/s (PSC Bridges-2 node description); 16 GB (ABCI's nodes in "
            "Fujitsu's MLPerf v0.6 system file)",
        ),
        DeviceSpec(
            "V100-SXM3-32GB",
            {"float32": 15.7e12, "float16": 125e12},
            900e9,
            32e9,
            "as V100-SXM2-16GB; 32 GB (NVIDIA's MLPerf v0.7 DGX-2H system file: "
            "'V100-SXM3-32GB (450W)'; its higher clock is not counted)",
        ),
        DeviceSpec(
            "A100-SXM4-40GB",
            {"float32": 19.5e12, "float16": 312e12},
            1555e9,
            40e9,
            "312 TFLOP/s FP16/BF16 tensor, 19.5 FP32, 1,555 GB/s, 40 GB "
            "(NVIDIA A100 datasheet, via glennklockwood.com/garden/processors/A100)",
        ),
        DeviceSpec(
            "A100-SXM4-80GB",
            {"float32": 19.5e12, "float16": 312e12},
            2039e9,
            80e9,
            "as A100-SXM4-40GB with 80 GB HBM2e at 2,039 GB/s (same sources)",
        ),
        DeviceSpec(
            "TPU v3",
            {"bfloat16": 123e12},
            900e9,
            32 * GIB,
            "123 TFLOP/s bf16, 32 GiB HBM2 at 900 GB/s a chip (cloud.google.com/tpu/docs/v3)",
        ),
        DeviceSpec(
            "TPU v4",
            {"bfloat16": 275e12},
            1200e9,
            32 * GIB,
            "275 TFLOP/s bf16, 32 GiB HBM2 at 1,200 GB/s a chip (cloud.google.com/tpu/docs/v4)",
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class Device:
    """A device's training speed: `images_per_second` (measured), or
    `peak_flops` x `utilization` with an optional `memory_bandwidth`
    (bytes/s) for the roofline; `half_batch` (b_half) and
    `fixed_step_seconds` (c_fixed) as in the module docstring."""

    peak_flops: float = 0.0
    utilization: float = 1.0
    memory_bandwidth: float = 0.0
    activation_bytes: int = 4
    images_per_second: float = 0.0
    input_images_per_second: float = 0.0  # the input pipeline's rate; 0: unlimited
    half_batch: float = 0.0
    fixed_step_seconds: float = 0.0

    def fill(self, images):
        """e(b) = b / (b + b_half): the fraction of the device b images use."""
        return images / (images + self.half_batch)

    def compute_seconds(self, profile, images):
        """b / rate if measured, else b * t_image / (u * e(b))."""
        if self.images_per_second:
            return images / self.images_per_second
        seconds = profile.image_seconds(
            self.peak_flops, self.memory_bandwidth, self.activation_bytes
        )
        return images * seconds / (self.utilization * self.fill(images))
