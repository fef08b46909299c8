"""LARS and LAMB under keras.distribution on the JAX backend, on 8 simulated
CPU devices (--xla_force_host_platform_device_count; no accelerator ran):
data parallel over 8 and model parallel on 2x2 and 2x4 (batch, model)
meshes, with the dense kernels sharded over "model" (also with 4 steps per
compiled call), each train as on one device. A trust ratio taken from one
shard's norm instead of the whole layer's would differ by O(1)."""

import json
import os
import subprocess
import sys

import pytest

from keras_lars import _internals
from tests.conftest import requires_jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def results():
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        PYTHONPATH=ROOT,
    )
    completed = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "jax_distribution_run.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout)


@requires_jax
@pytest.mark.subprocess
@pytest.mark.parametrize("optimizer", ["lars", "lamb"])
@pytest.mark.parametrize(
    "setup",
    ["data_parallel_8", "model_parallel_2x2", "model_parallel_2x4", "model_parallel_2x4_spe4"],
)
def test_distributed_training_equals_one_device(results, optimizer, setup):
    result = results[f"{optimizer}/{setup}"]
    problem = _internals.distribution_problem("model")
    if setup.startswith("model_parallel") and problem:
        # Keras < 3.10 keeps the slots of sharded variables replicated and
        # trains differently (0.68 for LARS on 2x4), as Keras >= 3.12 does with
        # jax < 0.6 (the tool's ResNet): the optimizer refuses.
        name = {"lars": "LARS", "lamb": "LAMB"}[optimizer]
        assert result == {
            "refused": f"{name} on variables sharded over a keras.distribution mesh: {problem}."
        }
        return
    # 8 steps; float32 sums in another order. Measured <= 2.6e-7.
    assert result["difference"] <= 2e-6, result
    if setup.startswith("model_parallel"):
        # The kernels and their optimizer slots really are sharded.
        assert result["kernel_shardings"] == [[None, "model"], ["model", None]]
        assert result["hidden_kernel_slot_shardings"]
        assert all(s == [None, "model"] for s in result["hidden_kernel_slot_shardings"])
    else:
        assert result["kernel_shardings"] == [[None, None], [None, None]]


@pytest.mark.parametrize(
    "keras, jax, processes, line",
    [
        (
            (3, 8, 0),
            (0, 5, 3),
            1,
            "Keras 3.8.0's JAX backend keeps the optimizer slots of sharded ",
        ),
        ((3, 10, 0), (0, 5, 3), 1, None),
        ((3, 11, 3), (0, 5, 3), 1, None),
        (
            (3, 12, 0),
            (0, 5, 3),
            1,
            "Keras 3.12.0's JAX backend with jax 0.5.3 trains model-parallel steps differently "
            "from one device: use jax >= 0.6 (TensorFlow >= 2.18 accepts it) or Keras < 3.12",
        ),
        ((3, 15, 1), (0, 5, 9), 2, "Keras 3.15.1's JAX backend with jax 0.5.9 trains model-"),
        ((3, 15, 1), (0, 6, 0), 1, None),
        (
            (3, 15, 1),
            (0, 6, 1),
            2,
            "jax 0.6.1 pairs the all-reduces of 2 processes wrongly (one aborts): use jax >= "
            "0.6.2 (TensorFlow >= 2.18 accepts it)",
        ),
        ((3, 10, 0), (0, 5, 3), 0, "jax 0.5.3 pairs the all-reduces of several processes "),
        ((3, 15, 1), (0, 6, 2), 2, None),
        ((3, 15, 1), (0, 10, 2), 0, None),
    ],
)
def test_distributions_refuse_the_versions_that_train_differently(
    keras, jax, processes, line, monkeypatch
):
    versions = {"keras": keras, "jax": jax}
    monkeypatch.setattr(_internals, "installed_version", versions.__getitem__)
    problem = _internals.distribution_problem("model", processes)
    assert problem is None if line is None else problem.startswith(line), problem
