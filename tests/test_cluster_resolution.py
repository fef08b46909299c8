"""--cluster (tools/train/cluster.py) without a cluster: what each launcher's
variables resolve to (SLURM's tasks node by node at the job's ports; auto,
TF_CONFIG then SLURM), and bad or damaged input refused in one line naming it
(SLURM's variables, for TensorFlow and for JAX; --cluster without
--strategy=multi_worker or JAX; a node list longer than the step;
JAX_COORDINATOR_PORT; an address named twice in TF_CONFIG; settings that
differ under JAX's own detection), in this process and by the tool's own
processes, which then write nothing. The real launches are
tests/test_launchers.py."""

import json
import threading
import time

import pytest

from keras_lars.tools.benchmark_allreduce import free_ports
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train import cluster
from keras_lars.tools.train.config import Config
from tests import test_train_jax as jax_tests
from tests.conftest import requires_jax
from tests.launcher_tasks import child_env
from tests.launcher_tasks import finish
from tests.launcher_tasks import free_slurm_job
from tests.launcher_tasks import slurm_env
from tests.launcher_tasks import start


# --- what each launcher resolves to, and bad input -----------------------------------
def test_slurm_tasks_node_by_node_with_ports_from_the_job(monkeypatch):
    base = 12000 + 16 * (4242 % 1250)
    for procid, (node, port) in enumerate([("n08", 0), ("n08", 1), ("n09", 0), ("n09", 1)]):
        env = slurm_env(4242, procid, tasks=4, node="n[08-09]")
        env.update(SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURMD_NODENAME=node)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        workers = [f"{n}:{base + p}" for n in ("n08", "n09") for p in (0, 1)]
        expected = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": procid}}
        assert cluster.slurm_tf_config() == expected
        assert cluster.slurm_tf_config(port_base=2000)["cluster"]["worker"][procid] == (
            f"{node}:{2000 + port}"
        )


def test_auto_is_tf_config_then_slurm(monkeypatch):
    for name in ("TF_CONFIG", *cluster.SLURM_MARKERS):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as error:
        cluster.kind("auto")
    assert str(error.value).startswith(
        "--strategy=multi_worker --cluster=auto: found no cluster here: TF_CONFIG is not set "
        "and neither are SLURM's SLURM_JOB_ID and SLURM_PROCID"
    )
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert cluster.kind("auto") == "slurm"
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
    assert cluster.kind("auto") == "tf_config" and cluster.kind("slurm") == "slurm"


@pytest.mark.parametrize(
    "change, line",
    [
        (
            {"SLURM_STEP_NODELIST": None, "SLURM_STEP_TASKS_PER_NODE": None},
            "--cluster=slurm: SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE are not set: run "
            "the tool as a task of srun (see docs/launchers.md)",
        ),
        ({"SLURM_PROCID": "one"}, "--cluster=slurm: SLURM_PROCID='one' is not a whole number"),
        ({"SLURM_PROCID": "2"}, "--cluster=slurm: SLURM_PROCID=2 is not in [0, "),
        ({"SLURM_STEP_NODELIST": "n[1-"}, '--cluster=slurm: Invalid hostlist format "n[1-"'),
        ({"SLURM_STEP_TASKS_PER_NODE": "1"}, "--cluster=slurm: Requested 2 tasks but only 1"),
        (
            {"SLURM_STEP_NUM_TASKS": "17", "SLURM_STEP_TASKS_PER_NODE": "17"},
            "--cluster=slurm: 17 tasks on a node need more than the 16 ports a job gets from "
            "SLURM_JOB_ID: give --cluster_port_base",
        ),
        (
            {"SLURM_STEP_NODELIST": "n[9-10]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"},
            "--cluster=slurm: SlurmClusterResolver puts task 0 on n10, but SLURMD_NODENAME=n9",
        ),
    ],
)
def test_bad_slurm_variables_are_one_line_naming_them(monkeypatch, change, line):
    env = dict(slurm_env(7, 0), SLURMD_NODENAME="n9" if "n[9" in str(change) else "localhost")
    env.update(change)
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as error:
        cluster.slurm_tf_config()
    message = str(error.value)
    assert message.startswith(line) and "\n" not in message, message


def test_bad_slurm_variables_for_jax_are_one_line_naming_them(monkeypatch):
    for name, value in slurm_env(7, 0).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_LOCALID")
    for change, line in [
        ({}, "--cluster=slurm: SLURM_LOCALID is not set: run the tool as a task of srun"),
        ({"SLURM_LOCALID": "0", "SLURM_NTASKS": "2x"}, "--cluster=slurm: SLURM_NTASKS='2x' is"),
        ({"SLURM_NTASKS": "1", "SLURM_PROCID": "1"}, "--cluster=slurm: SLURM_PROCID=1 is not in"),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": ",n1"}, "--cluster=slurm: SLURM_STEP_NO"),
    ]:
        for name, value in change.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(ConfigError) as error:
            cluster.slurm_processes()
        assert str(error.value).startswith(line), str(error.value)


def test_cluster_needs_multi_worker_or_jax():
    for settings, line in [
        (
            dict(cluster="slurm", strategy="mirrored"),
            "--cluster=slurm: needs --strategy=multi_worker, not --strategy=mirrored.",
        ),
        (dict(cluster="tf_config"), "--cluster=tf_config: needs --strategy=multi_worker, not "),
        (
            dict(cluster="tf_config", backend="jax"),
            "--cluster=tf_config: needs --backend=tensorflow --strategy=multi_worker.",
        ),
        (
            dict(cluster="slurm", strategy="multi_worker", cluster_port_base=80),
            "--cluster_port_base=80: must be 0 or in [1024, 65519].",
        ),
    ]:
        with pytest.raises(ConfigError) as error:
            Config(**settings)
        assert str(error.value).startswith(line), str(error.value)
    assert Config(cluster="slurm", backend="jax").cluster == "slurm"
    assert Config(strategy="multi_worker", cluster="slurm").cluster == "slurm"


def _outside_srun(model_dir):
    """[(args, env, last line)]: the tool started outside srun."""
    args = ["--strategy=multi_worker", f"--model_dir={model_dir}"]
    return [
        (
            [*args, "--cluster=slurm"],
            child_env(SLURM_JOB_ID="5"),
            "error: --cluster=slurm: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, "
            "SLURM_STEP_TASKS_PER_NODE are not set: run the tool as a task of srun (see "
            "docs/launchers.md)",
        ),
        (
            args,
            child_env(),
            "error: --strategy=multi_worker --cluster=auto: found no cluster here: TF_CONFIG is "
            "not set and neither are SLURM's SLURM_JOB_ID and SLURM_PROCID (run it under srun); "
            "set TF_CONFIG, or see docs/launchers.md",
        ),
        (
            ["--strategy=mirrored", "--cluster=slurm"],
            child_env(),
            "error: --cluster=slurm: needs --strategy=multi_worker, not --strategy=mirrored.",
        ),
    ]


@pytest.fixture(scope="module")
def bad_starts(tmp_path_factory):
    """{name: (model dir, [((status, output), expected last line)])}: the
    tool's processes of each group of bad starts, all started at once."""
    root = tmp_path_factory.mktemp("bad_starts")
    groups = {
        "outside_srun": (root / "outside", _outside_srun(root / "outside")),
        "damaged": (root / "damaged", _damaged_starts(root / "damaged")),
    }
    started = {
        name: [start(args, env) for args, env, _ in cases] for name, (_, cases) in groups.items()
    }
    return {
        name: (model_dir, list(zip(finish(started[name]), [line for _, _, line in cases])))
        for name, (model_dir, cases) in groups.items()
    }


def _ended_in_one_line_and_wrote_nothing(group):
    model_dir, outcomes = group
    for (status, output), line in outcomes:
        assert status == 1 and output.strip().splitlines()[-1] == line, output[-3000:]
    assert not model_dir.exists()


def test_the_tool_outside_srun_says_what_is_missing_and_writes_nothing(bad_starts):
    _ended_in_one_line_and_wrote_nothing(bad_starts["outside_srun"])


# --- the start's damaged input, one line each ----------------------------------------
def _set(monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_a_nodelist_longer_than_the_step_is_refused_at_once(monkeypatch):
    """Before: TensorFlow's resolver listed n[0-99999999]'s 10^8 names (68 s)
    and said nothing of the 2 tasks; JAX's took its first host."""
    _set(monkeypatch, slurm_env(7, 0, node="n[0-99999999]"))
    started = time.monotonic()
    with pytest.raises(ConfigError) as tf_error:
        cluster.slurm_tf_config()
    with pytest.raises(ConfigError) as jax_error:
        cluster.slurm_processes()
    assert time.monotonic() - started < 5
    nodes = "SLURM_STEP_NODELIST='n[0-99999999]' names 100000000 nodes, more than the 2 tasks"
    assert str(tf_error.value) == (
        f"--cluster=slurm: {nodes} of SLURM_STEP_NUM_TASKS=2 (each node of a step runs one at "
        "least)"
    )
    assert str(jax_error.value) == (
        f"--cluster=slurm: {nodes} of SLURM_NTASKS=2 (each node of a step runs one at least)"
    )
    assert [cluster.node_count(n) for n in ("n[01-04,07],m", "a,b", "n[1-", "n[3-1]")] == [
        6,
        2,
        None,
        None,
    ]


@pytest.mark.parametrize("port", ["abc", "0", "65536", "\uff17\uff10\uff10\uff10"])
def test_jax_coordinator_port_is_checked_and_named(monkeypatch, port):
    """Before: JAX_COORDINATOR_PORT=abc went to jax.distributed (a traceback,
    once a segmentation fault)."""
    _set(monkeypatch, dict(slurm_env(7, 0), JAX_COORDINATOR_PORT=port))
    for flag in ("--cluster=slurm", "--num_processes=0 (SLURM detected)"):
        with pytest.raises(ConfigError) as error:
            cluster.slurm_processes(flag=flag)
        assert str(error.value) == (
            f"{flag}: JAX_COORDINATOR_PORT={port!r} (the coordinator's port under SLURM) is "
            "not a port, a whole number in [1, 65535]"
        )


@requires_jax
def test_jaxs_own_detection_keeps_the_settings_handshake(monkeypatch):
    """Before: with --num_processes=0 the processes never met, so processes
    with other settings were not caught."""
    runtime_jax = pytest.importorskip("keras_lars.tools.train.runtime_jax")
    (port,) = free_ports(1)
    detected = []
    for procid in range(2):
        _set(monkeypatch, dict(slurm_env(7, procid), JAX_COORDINATOR_PORT=str(port)))
        config = Config(backend="jax", num_processes=0, worker_start_timeout_minutes=1)
        detected.append(runtime_jax.processes_of(config))
    assert detected[1] == {
        "coordinator_address": f"localhost:{port}",
        "num_processes": 2,
        "process_id": 1,
    }
    configs = [
        Config(backend="jax", num_processes=0, worker_start_timeout_minutes=1, global_batch_size=b)
        for b in (256, 512)
    ]
    outcome = []

    def chief_meets():
        try:
            runtime_jax.meet_processes(configs[0], processes=detected[0])
        except ConfigError as error:
            outcome.append(error)

    chief = threading.Thread(target=chief_meets)
    chief.start()
    with pytest.raises(ConfigError) as refused:
        runtime_jax.meet_processes(configs[1], processes=detected[1])
    chief.join()
    differ = "settings differ: --global_batch_size: 256 on process 0, 512 on process 1"
    assert str(refused.value) == (
        f"--num_processes=0 (detected: --num_processes=2 --process_id=1 --coordinator_address="
        f"localhost:{port}): process 0 at localhost:{port} refused process 1: {differ}"
    )
    assert str(outcome[0]).endswith(f": {differ}")


def test_tf_config_naming_an_address_twice_is_refused_up_front(monkeypatch):
    """Before: reported at the timeout as "something that is not this run's
    task accepts connections" (it was the chief itself)."""
    from keras_lars.distribute import parse_tf_config

    spec = {"chief": ["h:1"], "worker": ["h:2", "h:1"]}
    with pytest.raises(ValueError) as error:
        parse_tf_config(json.dumps({"cluster": spec, "task": {"type": "chief", "index": 0}}))
    assert str(error.value) == (
        "TF_CONFIG['cluster'] names h:1 twice (chief 0 and worker 1): each task listens on an "
        "address of its own."
    )


def _damaged_starts(model_dir):
    """[(args, env, last line)]: the tool started on damaged input."""
    port, job = free_ports(1)[0], free_slurm_job()
    twice = {
        "cluster": {"worker": [f"localhost:{port}"] * 2},
        "task": {"type": "worker", "index": 0},
    }
    jax_slurm = dict(jax_tests.jax_env(devices=1), **slurm_env(job, 0), JAX_COORDINATOR_PORT="abc")
    model_dir = f"--model_dir={model_dir}"
    return [
        (
            ["--strategy=multi_worker", "--worker_start_timeout_minutes=0.2", model_dir],
            child_env(TF_CONFIG=json.dumps(twice)),
            f"error: --strategy=multi_worker: TF_CONFIG['cluster'] names localhost:{port} twice "
            "(worker 0 and worker 1): each task listens on an address of its own.",
        ),
        (
            ["--backend=jax", "--num_processes=0", model_dir],
            jax_slurm,
            "error: --num_processes=0 (SLURM detected): JAX_COORDINATOR_PORT='abc' (the "
            "coordinator's port under SLURM) is not a port, a whole number in [1, 65535]",
        ),
        (
            ["--backend=jax", "--cluster=slurm", "--num_processes=0", model_dir],
            jax_slurm,
            "error: --cluster=slurm: JAX_COORDINATOR_PORT='abc' (the coordinator's port under "
            "SLURM) is not a port, a whole number in [1, 65535]",
        ),
        (
            ["--strategy=multi_worker", "--cluster=slurm", model_dir],
            child_env(**slurm_env(job, 0, node="n[0-99999999]")),
            "error: --cluster=slurm: SLURM_STEP_NODELIST='n[0-99999999]' names 100000000 nodes, "
            "more than the 2 tasks of SLURM_STEP_NUM_TASKS=2 (each node of a step runs one at "
            "least)",
        ),
        (
            [
                "--backend=jax",
                "--num_processes=2",
                "--coordinator_address=localhost:abc",
                model_dir,
            ],
            jax_tests.jax_env(devices=1),
            "error: --coordinator_address=localhost:abc --num_processes=2 --process_id=0: "
            "'localhost:abc' is not host:port",
        ),
    ]


def test_each_bad_start_of_the_tool_is_one_line(bad_starts):
    """The tool's own processes, each ending with one line and exit status 1,
    nothing written."""
    _ended_in_one_line_and_wrote_nothing(bad_starts["damaged"])
