"""What keras-lars-plan's settings mean to the models: the device and its
calibration, the model's profile, the batch and the memory it takes, the
cluster, the run and, under a schedule, its phases. `ModelInputs` is a base
of config.PlanSettings: its methods read the settings' fields. Importing it
imports no Keras: the methods that need the library (the step model, the
calibration, a schedule) import it when called."""

import dataclasses

from keras_lars.tools.plan.cost_models import GB
from keras_lars.tools.plan.cost_models import US
from keras_lars.tools.plan.cost_models import Cluster
from keras_lars.tools.plan.device import DEVICES
from keras_lars.tools.plan.device import DTYPE_BYTES
from keras_lars.tools.plan.device import Device
from keras_lars.tools.plan.device import custom_profile
from keras_lars.tools.plan.device import model_profile
from keras_lars.tools.plan.memory import largest_batch
from keras_lars.tools.plan.memory import memory_estimate
from keras_lars.tools.plan.phased_plan import PhasedPlan
from keras_lars.tools.plan.phased_plan import PhasePlan
from keras_lars.tools.plan.phased_plan import phase_spans
from keras_lars.tools.plan.records import CALIBRATED_UTILIZATION
from keras_lars.tools.plan.records import CALIBRATION_RECORD
from keras_lars.tools.schedule_flags import SETS
from keras_lars.tools.schedule_flags import batch_schedule

DEFAULT_PER_DEVICE_BATCH = 128  # or the largest power of two that fits, if smaller


class ModelInputs:
    """The models' inputs from the settings (config.PlanSettings's fields)."""

    # --- the device and its calibration
    def spec(self):
        return DEVICES[self.device]

    def capacity(self):
        return self.device_memory_gb * GB if self.device_memory_gb else self.spec().memory_bytes

    def calibration(self):
        """calibration.calibrate for --device at --activation_dtype (None:
        no published throughput)."""
        from keras_lars.tools.plan.calibration import calibrate

        return calibrate(self.spec(), self.activation_dtype, model_profile("resnet50"))

    def device_settings(self):
        """(utilization, half batch, fixed seconds, where they come from)."""
        calibrated = self.calibration()
        if calibrated:
            source = (
                f"fitted on {len(calibrated.points)} published ResNet-50 throughput"
                f"{'s' if len(calibrated.points) > 1 else ''} of a {self.device} in "
                f"{self.activation_dtype}"
            )
            values = calibrated.utilization, calibrated.half_batch, calibrated.fixed_step_seconds
        else:
            source = (
                f"no published throughput of a {self.device} in {self.activation_dtype}: "
                f"{CALIBRATED_UTILIZATION}, fitted on {CALIBRATION_RECORD}'s FP32 P100s"
            )
            values = CALIBRATED_UTILIZATION, 0.0, 0.0
        utilization = self.utilization or values[0]
        half = values[1] if self.half_batch < 0 else self.half_batch
        fixed = values[2] if self.fixed_step_ms < 0 else self.fixed_step_ms / 1e3
        if self.utilization:
            source = "given"
        return utilization, half, fixed, source

    def profile(self, image_size=None):
        if self.model == "custom":
            return custom_profile(self.parameters, self.forward_gflops * 1e9)
        return model_profile(self.model, image_size or self.image_size)

    def device_model(self):
        utilization, half, fixed, _ = self.device_settings()
        spec = self.spec()
        peak = self.peak_tflops * 1e12 or spec.peak(self.activation_dtype)
        return Device(
            peak_flops=peak,
            utilization=utilization,
            memory_bandwidth=self.memory_bandwidth * GB or spec.memory_bandwidth,
            activation_bytes=DTYPE_BYTES[self.activation_dtype],
            images_per_second=self.images_per_second,
            input_images_per_second=self.input_images_per_second,
            half_batch=0.0 if self.images_per_second else half,
            fixed_step_seconds=0.0 if self.images_per_second else fixed,
        )

    # --- the batch and memory
    def default_per_device_batch(self):
        """DEFAULT_PER_DEVICE_BATCH, or the largest power of two that fits."""
        fits = largest_batch(self.profile(), DTYPE_BYTES[self.activation_dtype], self.capacity())
        per_device = DEFAULT_PER_DEVICE_BATCH
        while per_device > fits:
            per_device //= 2
        return per_device

    @property
    def batch(self):
        """--global_batch_size, or its default."""
        return self.global_batch_size or self.devices * self.default_per_device_batch()

    def memory(self, global_batch=None, devices=None, image_size=None):
        """memory.MemoryEstimate of one device."""
        per_device = (global_batch or self.batch) / (devices or self.devices)
        return memory_estimate(
            self.profile(image_size),
            per_device,
            DTYPE_BYTES[self.activation_dtype],
            self.capacity(),
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
        from keras_lars.tools.plan.step import plan_run

        return plan_run(
            self.profile(),
            global_batch or self.batch,
            self.epochs,
            self.device_model(),
            self.cluster(devices),
            DTYPE_BYTES[self.gradient_dtype],
            self.overlap,
            self.examples,
        )

    # --- the schedule
    def schedule_flags(self):
        """The schedule flags given, as they read ('' if none)."""
        given = [name for name in SETS if getattr(self, name)]
        return " ".join(f"--{name}={getattr(self, name)}" for name in given)

    def schedule(self):
        """keras_lars.BatchSchedule of --batch_schedule and
        --image_size_schedule (None: neither)."""
        return batch_schedule(self, self.batch)

    def phase_spans(self):
        return phase_spans(self.schedule(), self.epochs, self.image_size)

    def phase_settings(self, span):
        """The plain settings of one phase: its batch, image size and epochs."""
        return dataclasses.replace(
            self,
            global_batch_size=span.global_batch,
            image_size=span.image_size,
            epochs=float(span.epochs),
            batch_schedule="",
            image_size_schedule="",
        )

    def phased_plan(self):
        """phases.PhasedPlan: each phase the plain plan of its settings."""
        plans = []
        for span in self.phase_spans():
            options = self.phase_settings(span)
            plans.append(PhasePlan(span, options.run(), options.memory()))
        return PhasedPlan(tuple(plans))
