"""What one device holds during a data-parallel training step, and whether
it fits.

    weights     = P (4 + s_a')        float32 master weights (+ a float16 or
                                      bfloat16 copy when s_a = 2: s_a' = s_a)
    gradients   = P * 4
    slots       = P * 4 * k           k: the optimizer's slots (LARS: 1, LAMB: 2)
    activations = b * sum_l O_l * s_a every layer's output, kept for the backward
                                      pass, O_l elements an image (at the image size)
    total       = weights + gradients + slots + activations

The verdict: `fits` up to RESERVE of the device's memory, `tight` up to
all of it (the framework's workspace and fragmentation may not fit),
`does not fit` above. Every layer output counted is an upper estimate:
frameworks fuse batch norm and ReLU and free what the backward pass no
longer needs.
"""

import dataclasses

RESERVE = 0.9  # of the device memory: the rest for workspace and fragmentation (assumed)
LARS_SLOTS = 1
UNLIMITED = 2**62  # images of a model given by its totals only (no activations counted)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device holds (see the module docstring)."""

    weights: float
    gradients: float
    slots: float
    activations: float
    capacity: float

    @property
    def total(self):
        return self.weights + self.gradients + self.slots + self.activations

    @property
    def verdict(self):
        """'fits', 'tight' or 'does not fit'."""
        if self.total <= RESERVE * self.capacity:
            return "fits"
        return "tight" if self.total <= self.capacity else "does not fit"


def activation_elements(profile):
    """sum_l O_l: the elements of every layer's output, per image."""
    return sum(layer.output_elements for layer in profile.layers)


def memory_estimate(profile, per_device_batch, activation_bytes, capacity, slots=LARS_SLOTS):
    """The MemoryEstimate of `per_device_batch` images on a device of
    `capacity` bytes."""
    parameters = profile.parameters
    low_precision_copy = activation_bytes if activation_bytes < 4 else 0
    return MemoryEstimate(
        weights=parameters * (4 + low_precision_copy),
        gradients=parameters * 4,
        slots=parameters * 4 * slots,
        activations=per_device_batch * activation_elements(profile) * activation_bytes,
        capacity=capacity,
    )


def largest_batch(profile, activation_bytes, capacity, slots=LARS_SLOTS):
    """The most images a device holds within RESERVE of `capacity` (0 if
    not even the weights fit; UNLIMITED for a model without activations)."""
    empty = memory_estimate(profile, 0, activation_bytes, capacity, slots)
    room = RESERVE * capacity - empty.total
    if room < 0:
        return 0
    per_image = activation_elements(profile) * activation_bytes
    return int(room // per_image) if per_image else UNLIMITED
