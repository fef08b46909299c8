"""Elastic resume: a run checkpointed on 2 workers resumes
on 1 process with the same global batch, and the reverse, with real processes
on localhost (--strategy=multi_worker, TF_CONFIG as in tests/test_train_cluster.py).
The same runs carry a batch change (--batch_schedule): 2 workers with it
equal one process with it, and the resume is inside its second
phase.

A resume on another layout (workers, replicas) is exact only where a step does
not depend on how the global batch is split (model_dir.check_layout): digits'
global batches are the same for every split, and with --sync_batch_norm
ResNet-20 (the default model) computes nothing per replica. Then the resumed run ends as the
uninterrupted runs on either layout, to float32 tolerance. Without
--sync_batch_norm each replica normalizes its own half of the batch, and the
resume is refused in one line naming both layouts, nothing lost.

The uninterrupted runs all start at once, and so do the reruns.

Every process runs with TF_ENABLE_ONEDNN_OPTS=0: oneDNN's CPU kernels round a
batch of 128 differently from one of 256 (measured: 1e-4 apart after one
step with them, 6e-6 without), which is the kernels' doing, not the layout's.
"""

import json
import os
import shutil
import subprocess

import keras
import numpy as np
import pytest

from keras_lars.tools import checkpoints
from keras_lars.tools import train
from keras_lars.tools.benchmark_allreduce import free_ports
from keras_lars.tools.train import model_dir as train_model_dir
from tests.processes import finish as processes_finish
from tests.train_tool import ROOT
from tests.train_tool import TIMEOUT
from tests.train_tool import fingerprint
from tests.train_tool import h5_arrays
from tests.train_tool import tool_command

# The first 320 digits at 8x8: 5 steps of 64 (epoch 1), then 2 of 128 (epoch
# 2); a constant rate (LARS at 0.1: at 1.0 its trust ratio amplifies rounding
# between any two layouts); a step checkpoint every 6 steps, so the last but
# one is step 1 of epoch 2, in the second phase. (Were batches of 256 and 512
# of all 1,438: the same steps at 4x the compute; the fixture of the
# uninterrupted runs took 207 s alone, now 93 s.)
SHARED = [
    "--image_size=8",
    "--train_examples=320",
    "--batch_schedule=0:64,1:128",
    "--train_epochs=2",
    "--warmup_epochs=0",
    "--base_learning_rate=0.1",
    "--end_learning_rate=0.1",
    "--lr_scaling=none",
    "--checkpoint_every_steps=6",
]
SYNCED = [*SHARED, "--sync_batch_norm"]
# One step of the first 128 digits, not evaluated, for the refusals: they
# come before any step of the rerun. (Was one step of 1024: 8x the compute
# for no claim.)
UNSYNCED = ["--image_size=8", "--global_batch_size=128"]
UNSYNCED += ["--train_examples=128"]
UNSYNCED += ["--train_epochs=1", "--warmup_epochs=0", "--noeval"]
# The resumed run ends as the uninterrupted run on its old layout: its last
# step ran on the new one (measured on ResNet-20, largest absolute difference:
# 1.4e-6 from 2 workers to 1, 3.0e-6 from 1 to 2, TF 2.21, 2026-12-07). The
# runs on the two layouts were 4.2e-6 apart after their 7 steps, float32
# rounding (ResNet-18 parted by 2.0e-3: 2 replicas differed from 1 by more
# than rounding in its last stage, open, see tests/test_launchers.py).
# Without --sync_batch_norm they are 1.9e-2 apart after one step. The bounds
# sit 3 to 5 times over the measured figures.
RTOL, ATOL, LAYOUTS_ATOL = 1e-4, 1e-5, 2e-5
LAST, RESUMED_FROM = "ckpt-0002", "ckpt-0001-000001"
LAYOUT_CHANGES = [(2, 1), (1, 2)]  # (workers before, after)
LAYOUT_IDS = ["2_workers_to_1", "1_to_2_workers"]


def _start(args, model_dir, workers):
    """The tool on 1 process, or on `workers` > 1 workers of one TF_CONFIG."""
    env = dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", TF_ENABLE_ONEDNN_OPTS="0"
    )
    streams = dict(cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if workers == 1:
        return [
            subprocess.Popen(tool_command(*args, f"--model_dir={model_dir}"), env=env, **streams)
        ]
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(workers)]}
    return [
        subprocess.Popen(
            tool_command("--strategy=multi_worker", *args, f"--model_dir={model_dir}"),
            env=dict(
                env,
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
            ),
            **streams,
        )
        for i in range(workers)
    ]


def _finish(processes):
    """[(return code, stdout, stderr)] of each; kills what is left on a timeout."""
    return processes_finish(processes, TIMEOUT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{kind: {workers: model_dir}}: the uninterrupted runs on 2 workers and
    on 1 process, SYNCED and UNSYNCED, all six processes at once; every one
    must end 0."""
    root = tmp_path_factory.mktemp("runs")
    dirs = {kind: {2: root / f"{kind}2", 1: root / f"{kind}1"} for kind in ("synced", "unsynced")}
    args = {"synced": SYNCED, "unsynced": UNSYNCED}
    started = {
        (kind, workers): _start(args[kind], model_dir, workers)
        for kind, model_dirs in dirs.items()
        for workers, model_dir in model_dirs.items()
    }
    ended = {key: _finish(processes) for key, processes in started.items()}
    for (kind, workers), results in ended.items():
        for code, _, err in results:
            assert code == 0, f"{kind}, {workers} worker(s): {err[-3000:]}"
    return dirs


@pytest.fixture(scope="module")
def reruns(runs, tmp_path_factory):
    """{(kind, before, after): (model_dir, fingerprint before the rerun,
    [(return code, stdout, stderr)])}: each run of `runs` rerun on the
    other layout in a copy (a synced one as if stopped at its mid-epoch
    checkpoint), all four reruns (six processes) at once."""
    root = tmp_path_factory.mktemp("reruns")
    started = {}
    for kind, args in (("synced", SYNCED), ("unsynced", UNSYNCED)):
        for before, after in LAYOUT_CHANGES:
            copy = root / f"{kind}_{before}_to_{after}"
            shutil.copytree(runs[kind][before], copy)
            if kind == "synced":
                _stop_at_mid_epoch(copy)
            started[kind, before, after] = copy, fingerprint(copy), _start(args, copy, after)
    return {key: (copy, files, _finish(ps)) for key, (copy, files, ps) in started.items()}


def _stop_at_mid_epoch(copy):
    """Makes the copy of a finished run as if stopped at its mid-epoch checkpoint."""
    for path in [*(copy / "checkpoints").glob(f"{LAST}.*"), copy / "summary.json"]:
        path.unlink()
    assert checkpoints.saved(str(copy / "checkpoints"))[-1] == (1, 1)


def _weights(model_dir, name=LAST):
    return h5_arrays(model_dir / "checkpoints" / f"{name}.weights.h5")


def _assert_close(actual, expected, atol):
    assert actual.keys() == expected.keys() and len(actual) > 100
    for name in actual:
        np.testing.assert_allclose(actual[name], expected[name], RTOL, atol, err_msg=name)


@pytest.mark.multiworker
def test_two_workers_with_a_batch_change_equal_one_process(runs):
    synced = runs["synced"]
    summaries = {n: json.loads((d / "summary.json").read_text()) for n, d in synced.items()}
    for summary in summaries.values():
        assert [(h["steps"], h["global_batch_size"]) for h in summary["history"]] == [
            (5, 64),
            (7, 128),
        ]
    for two, one in zip(summaries[2]["history"], summaries[1]["history"], strict=True):
        # Measured 2.0e-5 and 0 (2026-12-07).
        assert two["val_loss"] == pytest.approx(one["val_loss"], abs=1e-4)
        assert two["loss"] == pytest.approx(one["loss"], abs=1e-4)
    _assert_close(_weights(synced[2]), _weights(synced[1]), LAYOUTS_ATOL)


@pytest.mark.multiworker
@pytest.mark.parametrize("before, after", LAYOUT_CHANGES, ids=LAYOUT_IDS)
def test_a_synced_run_resumes_exactly_on_the_other_layout(runs, reruns, before, after):
    synced = runs["synced"]
    copy, _, results = reruns["synced", before, after]
    assert [code for code, _, _ in results] == [0] * after, results[0][2][-3000:]
    layouts = {1: "1 process of 1 replica", 2: "2 workers of 1 replica each"}
    for _, out, _ in results:
        assert (
            f"the checkpoint {copy / 'checkpoints' / RESUMED_FROM} was written by "
            f"{layouts[before]}; this run has {layouts[after]}: resuming it (the same "
            "global batches, nothing computed per replica; only the rounding differs)"
        ) in out
        assert f"resuming {copy} after epoch 1, step 1 of epoch 2" in out
    # It ends as the run on its old layout, within rounding of the new one's.
    resumed, old = _weights(copy), _weights(synced[before])
    _assert_close(resumed, old, ATOL)
    _assert_close(resumed, _weights(synced[after]), LAYOUTS_ATOL)
    # Its step moved the weights far beyond the tolerance (0.60, 2026-12-07;
    # the float arrays: the step counter moves by 1 in any step).
    start = _weights(copy, RESUMED_FROM)
    floats = [k for k in resumed if resumed[k].dtype.kind == "f"]
    assert max(np.abs(resumed[k] - start[k]).max() for k in floats) > 100 * ATOL
    summary = json.loads((copy / "summary.json").read_text())
    whole = json.loads((synced[before] / "summary.json").read_text())
    assert [(h["epoch"], h["steps"]) for h in summary["history"]] == [(1, 5), (2, 7)]
    assert summary["history"][0] == whole["history"][0]  # the epoch of the old layout
    # The training metrics of epoch 2 average the steps this process ran.
    # val_loss measured 2.0e-5 apart, val_accuracy equal (2026-12-07; 0.003
    # is one of the 359 validation digits).
    for key, within in {"val_loss": 1e-4, "val_accuracy": 0.003, "learning_rate": 0}.items():
        assert summary["final"][key] == pytest.approx(whole["final"][key], abs=within), key
    state = json.loads((copy / "checkpoints" / f"{LAST}.json").read_text())
    assert state["layout"] == {"workers": after, "replicas": after}


@pytest.mark.multiworker
@pytest.mark.parametrize("before, after", LAYOUT_CHANGES, ids=LAYOUT_IDS)
def test_an_unsynced_run_on_the_other_layout_is_refused_naming_both(reruns, before, after):
    copy, files, results = reruns["unsynced", before, after]
    assert len(results) == after
    layouts = {1: "1 process of 1 replica", 2: "2 workers of 1 replica each"}
    expected = (
        f"error: --model_dir={copy}: the checkpoint {copy / 'checkpoints' / 'ckpt-0001'} was "
        f"written by {layouts[before]}; this run has {layouts[after]}: batch-norm statistics "
        "are per replica (--nosync_batch_norm), so it would not resume the same run; resume it "
        f"on {layouts[before]}, or use another --model_dir."
    )
    for code, out, err in results:
        assert code == 1, err[-3000:]
        assert [line for line in err.splitlines() if line.startswith("error:")] == [expected]
        assert "Traceback" not in err and "resuming" not in out
    assert fingerprint(copy) == files  # byte for byte: nothing written, nothing lost


def _model(*layers):
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), *layers])


@pytest.mark.parametrize(
    "settings, layers, reason",
    [
        (
            dict(dataset="imagenet", data_dir="gs://b/d", sync_batch_norm=True),
            "synced",
            "--dataset=imagenet makes other global batches for another split",
        ),
        (dict(), "unsynced", "batch-norm statistics are per replica (--nosync_batch_norm)"),
        (dict(model="alexnet"), "dropout", "--model=alexnet draws its dropout masks per replica"),
        (
            dict(sync_batch_norm=True, allreduce_dtype="bfloat16"),
            "synced",
            "--allreduce_dtype=bfloat16 rounds the sum of several replicas only",
        ),
        (
            dict(sync_batch_norm=True, backend="jax"),
            "synced",
            "resuming on another layout is verified on --backend=tensorflow only",
        ),
    ],
)
def test_each_way_a_step_depends_on_the_split_refuses_another_layout(
    tmp_path, settings, layers, reason
):
    kinds = {
        "synced": [keras.layers.BatchNormalization(synchronized=True)],
        "unsynced": [keras.layers.BatchNormalization()],
        "dropout": [keras.layers.Dropout(0.5)],
    }
    config = train.Config(model_dir=str(tmp_path), **settings)
    model = _model(*kinds[layers])
    state = {"layout": {"workers": 2, "replicas": 4}}
    who = "processes" if config.backend == "jax" else "workers"
    with pytest.raises(train.ConfigError) as raised:
        train_model_dir.check_layout(
            config, model, state, {"workers": 1, "replicas": 1}, "ckpt-0001"
        )
    assert str(raised.value) == (
        f"--model_dir={tmp_path}: the checkpoint ckpt-0001 was written by 2 {who} of 2 "
        f"replicas each; this run has 1 process of 1 replica: {reason}, so it would not "
        f"resume the same run; resume it on 2 {who} of 2 replicas each, or use another "
        "--model_dir."
    )
    # The layout that wrote it, or a state of an earlier version: no check.
    for same in (state, {}):
        train_model_dir.check_layout(config, model, same, state["layout"], "ckpt-0001")


def test_a_split_free_step_resumes_on_another_layout_saying_so(tmp_path, capsys):
    config = train.Config(model_dir=str(tmp_path), sync_batch_norm=True)
    model = _model(keras.layers.BatchNormalization(synchronized=True), keras.layers.Dropout(0))
    state = {"layout": {"workers": 1, "replicas": 2}}
    train_model_dir.check_layout(config, model, state, {"workers": 4, "replicas": 4}, "ckpt-0003")
    assert capsys.readouterr().out == (
        "the checkpoint ckpt-0003 was written by 1 process of 2 replicas; this run has 4 "
        "workers of 1 replica each: resuming it (the same global batches, nothing "
        "computed per replica; only the rounding differs)\n"
    )
