"""Our LARS and LAMB against the real upstream implementations, step by step.

tests/golden/ holds the weights that tensorflow-addons, tensorflow/tpu,
tf-models-official, timm, optax and apex's LARC produced on fixed inputs (10
steps, a learning rate that changes every step, a layer that starts at zero and
a zero-gradient step); tests/golden/README.md says how they were made, outside
CI. tests/golden/cases.py maps each peer and mode to our options and states the
tolerances. Every step's weights are compared, on the TensorFlow backend here
and on the JAX backend in one child process.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import requires_jax
from tests.golden import cases

STEMS = cases.golden_stems()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _assert_matches(stem, ours, golden, tolerance):
    """Every step of every variable: max|ours - upstream| <= tolerance *
    max|upstream| (exact equality for tolerance 0), except where the case
    says the peer diverges; there the difference must show."""
    case = cases.CASES[stem]
    for name, expected in golden.items():
        actual = ours[name]
        assert actual.shape == expected.shape, (stem, name)
        start = case.diverges.get(name, len(expected))
        for step in range(start):
            a, e = actual[step], expected[step]
            if tolerance == 0:
                np.testing.assert_array_equal(a, e, err_msg=f"{stem}: {name}, step {step}")
                continue
            error = float(np.max(np.abs(a.astype(np.float64) - e)))
            scale = float(np.max(np.abs(e)))
            assert error <= tolerance * scale, (
                f"{stem}: {name}, step {step}: max|ours - upstream| = {error:.3g}, "
                f"{error / scale:.3g} of max|upstream| = {scale:.3g} (tolerance {tolerance:g})"
            )
        if start < len(expected):  # the documented divergence is still there
            error = float(np.max(np.abs(actual[start].astype(np.float64) - expected[start])))
            scale = float(np.max(np.abs(expected[start])))
            assert error > 100 * cases.TOLERANCE[case.tolerance] * scale, (
                f"{stem}: {name} now matches at step {start}; update `diverges` "
                f"and the note: {case.note}"
            )


def test_every_golden_file_has_a_case():
    assert set(STEMS) == set(cases.CASES)
    assert {stem.split("__")[0] for stem in STEMS} == {
        "tfa_lamb",
        "tpu_lars",
        "models_lars",
        "timm_lars",
        "optax_lars",
        "apex_larc",
    }


def test_inputs_exercise_the_edge_cases():
    names, weights, grads, rates = cases.load_inputs()
    assert len(grads) == 10
    for rate in rates.values():  # the rate changes every step
        assert np.all(np.diff(rate) != 0)
    weights = dict(zip(names, weights))
    assert not np.any(weights["zero/kernel"])  # ||w|| = 0 at the first step
    zero_steps = [
        k for k, step in enumerate(grads) if not np.any(step[names.index("dense/kernel")])
    ]
    assert zero_steps == [3]  # ||g|| = 0 once


@pytest.mark.parametrize("stem", STEMS)
def test_golden_file_records_its_upstream_run(stem):
    meta, trajectory = cases.load_golden(stem)
    names, weights, grads, _ = cases.load_inputs()
    assert f"{meta['peer']}__{meta['mode']}" == stem
    assert list(trajectory) == names
    for name, w in zip(names, weights):
        assert trajectory[name].shape == (len(grads), *w.shape)
    arguments = meta["arguments"]
    for key, value in cases.CASES[stem].upstream.items():
        if isinstance(value, dict):
            for inner, inner_value in value.items():
                assert arguments[key][inner] == inner_value, (key, inner)
        else:
            assert arguments[key] == value, key
    assert "python" in meta["versions"]
    assert "commit" in meta.get("source", {"commit": None})


@pytest.mark.parametrize("stem", STEMS)
def test_tensorflow_matches_upstream(stem):
    case = cases.CASES[stem]
    meta, golden = cases.load_golden(stem)
    optimizer, variables, ours = cases.run(stem)

    # The same variables left out of weight decay and of layer adaptation.
    names = list(golden)
    decays = case.options.get("weight_decay", 0.0) > 0
    expected = [n for n in names if decays and n not in meta["excluded_from_weight_decay"]]
    assert [n for n, v in zip(names, variables) if optimizer.uses_weight_decay(v)] == expected
    expected = [n for n in names if n not in meta["excluded_from_layer_adaptation"]]
    assert [n for n, v in zip(names, variables) if optimizer.uses_layer_adaptation(v)] == expected

    _assert_matches(stem, ours, golden, case.tensorflow_tolerance)


JAX_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import keras
import numpy as np
from tests.golden import cases
assert keras.backend.backend() == "jax", keras.backend.backend()
arrays, errors = {}, {}
for stem in cases.golden_stems():
    try:
        _, _, trajectory = cases.run(stem)
    except Exception as error:  # reported by that case's test
        errors[stem] = repr(error)
        continue
    arrays.update({f"{stem}:{name}": value for name, value in trajectory.items()})
np.savez(sys.argv[2], **arrays)
with open(sys.argv[3], "w") as f:
    json.dump(errors, f)
"""


@pytest.fixture(scope="module")
def jax_trajectories(tmp_path_factory):
    """Every case run once on the JAX backend, in one child process."""
    folder = tmp_path_factory.mktemp("golden_jax")
    arrays, errors = folder / "trajectories.npz", folder / "errors.json"
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    completed = subprocess.run(
        [sys.executable, "-c", JAX_SCRIPT, ROOT, str(arrays), str(errors)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    with np.load(arrays) as data:
        trajectories = {}
        for key in data.files:
            stem, name = key.split(":")
            trajectories.setdefault(stem, {})[name] = data[key]
    return trajectories, json.loads(errors.read_text())


@requires_jax
@pytest.mark.subprocess
@pytest.mark.parametrize("stem", STEMS)
def test_jax_matches_upstream(stem, jax_trajectories):
    trajectories, errors = jax_trajectories
    assert stem not in errors, errors.get(stem)
    _, golden = cases.load_golden(stem)
    case = cases.CASES[stem]
    _assert_matches(stem, trajectories[stem], golden, cases.TOLERANCE[case.tolerance])
