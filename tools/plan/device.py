"""What one device spends on one trained image: the model's per-layer
profile, its roofline time, and the device's speed.

    t_image = sum over layers l of max(3 F_l / P, 3 A_l s_a / M)
    compute = b * t_image / u        (or b / rate, a measured images/s)

F_l: layer l's forward FLOPs per image (a multiply-add counts 2): a
convolution 2 kh kw (cin / groups) cout Hout Wout, a dense layer 2 in out,
other layers 0. Training costs 3x the forward pass (the backward pass
computes the gradients of the inputs and of the weights, 2x). A_l: the
elements layer l reads and writes per image (inputs + outputs), moved 3
times in training (forward; backward reads the saved activations and the
output gradient and writes the input gradient), s_a bytes each. P: peak
FLOP/s at the arithmetic the run uses; M: memory bandwidth (0: FLOPs only);
u: utilization. Each layer takes the longer of its compute and memory times,
a roofline (Williams, Waterman & Patterson 2009, "Roofline", CACM 52(4)).

Profiles are counted on the Keras definitions of keras_lars.models, built on
the CPU: ResNet-50 has 25,557,032 trainable parameters and 4,089,184,256
multiply-adds per 224x224 image (8.18 GFLOPs forward, 24.5 per trained image).
"""

import dataclasses
import functools
import math

import keras

from keras_lars.models import BUILDERS

TRAINING_FLOPS_FACTOR = 3  # forward + backward (2x forward)
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
    """Builds keras_lars.models.BUILDERS[name] on the CPU and profiles it."""
    with keras.device("cpu:0"):
        model = BUILDERS[name](num_classes=num_classes, input_shape=(image_size, image_size, 3))
    return profile_keras_model(model)


def custom_profile(parameters, forward_flops, name="custom"):
    """A model given by its totals only (one pseudo-layer, no activations)."""
    layer = LayerProfile(name, "given", int(parameters), int(forward_flops), 0, 0)
    return ModelProfile(name, (layer,))


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
        """b / rate if measured, else b * t_image / u."""
        if self.images_per_second:
            return images / self.images_per_second
        seconds = profile.image_seconds(
            self.peak_flops, self.memory_bandwidth, self.activation_bytes
        )
        return images * seconds / self.utilization
