"""Pipeline parallelism on paper: GPipe (Huang et al. 2019, "GPipe:
Efficient Training of Giant Neural Networks using Pipeline Parallelism",
NeurIPS, arXiv:1811.06965). Keras has no pipeline engine; this only
estimates one.

The layers are cut into p stages of about equal FLOPs, one a device, and a
replica's batch of B images into m micro-batches of B / m. Forward and
backward each take m + p - 1 slots of the slowest stage:

    slot     = compute(slowest stage, B / m) + hop
    hop      = 2 (B / m) I_cut s_a / bandwidth   activations to the next stage
                                                 and their gradients back
    step     = (m + p - 1) slot + c_fixed + exposed gradient all-reduce of the stage
    bubble   = (p - 1) / (m + p - 1)             the idle fraction (GPipe, sec. 2.2)
    memory   = weights, gradients, slots of P_stage + B (A_stage) s_a
               (every micro-batch's activations kept for the backward pass;
               GPipe's re-materialization keeps B I_in s_a + (B / m) A_stage s_a)

A_stage: the output elements of the stage's layers per image; I_cut: the
output elements of a stage's last layer. With d = devices / p replicas the
gradients of each stage are all-reduced over its d copies.
"""

import dataclasses

from keras_lars.tools.plan.cost_models import allreduce_time
from keras_lars.tools.plan.device import ModelProfile
from keras_lars.tools.plan.memory import LARS_SLOTS
from keras_lars.tools.plan.memory import memory_estimate
from keras_lars.tools.plan.step import BACKWARD_FRACTION
from keras_lars.tools.plan.step import exposed_communication

MICRO_BATCHES_PER_STAGE = 4  # GPipe: the bubble is negligible once m >= 4 p (sec. 2.2)


def bubble_fraction(stages, micro_batches):
    """(p - 1) / (m + p - 1): the fraction of a pipelined step each device
    idles (Huang et al. 2019, sec. 2.2)."""
    return (stages - 1) / (micro_batches + stages - 1)


def split_stages(profile, stages):
    """The layers cut into `stages` contiguous ModelProfiles of about equal
    forward FLOPs (a cut after the layer where the running total passes
    k / p of the whole)."""
    total = profile.forward_flops
    parts, current, running = [], [], 0
    for layer in profile.layers:
        current.append(layer)
        running += layer.forward_flops
        if len(parts) < stages - 1 and running >= total * (len(parts) + 1) / stages:
            parts.append(current)
            current = []
    parts.append(current)
    parts += [[] for _ in range(stages - len(parts))]
    return [ModelProfile(f"{profile.name}[{i}]", tuple(p)) for i, p in enumerate(parts)]


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """One GPipe layout: p stages x d replicas, m micro-batches (seconds and
    bytes of one step; see the module docstring)."""

    stages: int
    replicas: int
    micro_batches: int
    slot: float
    communication: float
    exposed_communication: float
    memory: object  # memory.MemoryEstimate of the fullest stage
    fixed: float = 0.0

    @property
    def bubble(self):
        return bubble_fraction(self.stages, self.micro_batches)

    @property
    def step(self):
        slots = (self.micro_batches + self.stages - 1) * self.slot
        return slots + self.fixed + self.exposed_communication


def pipeline_plan(profile, global_batch, device, cluster, stages, micro_batches=0, options=None):
    """The PipelinePlan of `stages` stages over `cluster` (stages inside a
    node use the intra-node link), m = MICRO_BATCHES_PER_STAGE p unless
    given (at most the replica's batch). `options`: gradient_bytes,
    overlap, capacity (device memory, bytes)."""
    options = options or {}
    replicas = cluster.devices // stages
    batch = global_batch / replicas
    micro_batches = int(min(micro_batches or MICRO_BATCHES_PER_STAGE * stages, batch))
    micro = batch / micro_batches
    parts = split_stages(profile, stages)
    inside_a_node = stages <= cluster.devices_per_node
    link = cluster.intra_bandwidth if inside_a_node else cluster.inter_bandwidth
    slots, fullest, stage_compute = [], None, 0.0
    for part in parts:
        compute = device.compute_seconds(part, micro) if part.layers else 0.0
        cut = part.layers[-1].output_elements if part.layers else 0
        hop = 2 * micro * cut * device.activation_bytes / link
        slots.append(compute + hop)
        estimate = memory_estimate(
            part, batch, device.activation_bytes, options.get("capacity", 0.0), LARS_SLOTS
        )
        if fullest is None or estimate.total > fullest.total:
            fullest = estimate
        stage_compute = max(stage_compute, compute * micro_batches)
    largest = max(part.parameters for part in parts)
    per_node = max(1, cluster.devices_per_node // stages)
    replica_cluster = dataclasses.replace(
        cluster, devices=replicas, devices_per_node=min(per_node, replicas), torus_x=0
    )
    if replica_cluster.devices % replica_cluster.devices_per_node:
        replica_cluster = dataclasses.replace(replica_cluster, devices_per_node=1)
    communication = allreduce_time(largest * options.get("gradient_bytes", 4), replica_cluster)
    exposed = exposed_communication(
        communication, BACKWARD_FRACTION * stage_compute, options.get("overlap", True)
    )
    return PipelinePlan(
        stages,
        replicas,
        micro_batches,
        max(slots),
        communication,
        exposed,
        fullest,
        device.fixed_step_seconds,
    )


def pipeline_candidates(profile, global_batch, device, cluster, options=None, most=8):
    """PipelinePlans for p = 2, 4, ... up to `most` stages, where p divides
    the devices and every replica gets at least one image."""
    plans = []
    stages = 2
    while stages <= min(most, cluster.devices, len(profile.layers)):
        if cluster.devices % stages == 0 and global_batch >= cluster.devices // stages:
            plans.append(pipeline_plan(profile, global_batch, device, cluster, stages, 0, options))
        stages *= 2
    return plans
