"""The planner's GPipe estimate against hand-computed closed forms."""

import pytest

from keras_lars.tools import plan


def _layers(*flops, outputs=100):
    return plan.ModelProfile(
        "toy",
        tuple(
            plan.LayerProfile(f"l{i}", "Dense", 1000, f, outputs, outputs)
            for i, f in enumerate(flops)
        ),
    )


@pytest.mark.parametrize(
    "stages, micro_batches, bubble", [(4, 12, 3 / 15), (2, 8, 1 / 9), (1, 4, 0.0), (8, 1, 7 / 8)]
)
def test_bubble_fraction_is_huang_et_al_s(stages, micro_batches, bubble):
    assert plan.bubble_fraction(stages, micro_batches) == pytest.approx(bubble)


def test_stages_cut_at_equal_shares_of_the_flops():
    names = [
        [layer.name for layer in part.layers] for part in plan.split_stages(_layers(1, 1, 1, 1), 2)
    ]
    assert names == [["l0", "l1"], ["l2", "l3"]]
    names = [
        [layer.name for layer in part.layers] for part in plan.split_stages(_layers(3, 1, 1, 1), 2)
    ]
    assert names == [["l0"], ["l1", "l2", "l3"]]


def test_pipeline_step_closed_form():
    profile = _layers(1e9, 1e9, 1e9, 1e9)
    device = plan.Device(
        peak_flops=1e12, utilization=1.0, activation_bytes=2, fixed_step_seconds=0.001
    )
    cluster = plan.Cluster(2, 2, 10e9, 0.0, 1e9, 0.0, "ring")
    pipe = plan.pipeline_plan(profile, 8, device, cluster, stages=2, micro_batches=4)
    # one replica, micro-batches of 2 images; a stage: 2 layers x 3 x 1e9 FLOPs an image
    compute = 2 * 2 * 3e9 / 1e12
    hop = 2 * 2 * 100 * 2 / 10e9  # activations of the cut forward, their gradients back
    assert pipe.slot == pytest.approx(compute + hop)
    assert pipe.step == pytest.approx((4 + 2 - 1) * (compute + hop) + 0.001)
    assert pipe.replicas == 1 and pipe.communication == 0.0
    assert pipe.bubble == pytest.approx(1 / 5)
    # a stage keeps the 8 images' outputs of its 2 layers: 8 * 200 * 2 bytes
    assert pipe.memory.activations == 8 * 200 * 2
    assert pipe.memory.weights == 2000 * (4 + 2)


def test_alexnet_on_8_devices_keeps_data_parallelism_at_a_large_batch():
    options = plan.PlanSettings(model="alexnet", devices=8, global_batch_size=1024)
    text = plan.layers_text(options)
    assert "pipeline (GPipe, Huang et al. 2019)" in text
    assert text.splitlines()[-1].startswith("data parallelism is the better layout here")


def test_a_pipeline_wins_when_the_all_reduce_dominates():
    # 8 nodes of one device on a 0.1 GB/s network, 8 images a device: the 102 MB
    # all-reduce dwarfs the compute, and 8 stages exchange only activations
    options = plan.PlanSettings(
        devices=8, devices_per_node=1, global_batch_size=64, inter_node_bandwidth=0.1
    )
    last = plan.layers_text(options).splitlines()[-1]
    assert last.startswith("a pipeline would beat data parallelism:"), last
