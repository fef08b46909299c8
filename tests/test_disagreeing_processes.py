"""The settings every process of a run shares, and processes that disagree:
the start-up handshake (keras_lars.rendezvous) names each setting that differs
and who holds which value; on JAX's road (runtime_jax.meet_processes) the
processes stop with one line naming the settings, a process beyond the chief's
count is refused, and an address the coordinator cannot hold is not blamed on
the timeout."""

import socket

import pytest

from keras_lars import rendezvous
from keras_lars.tools.benchmark_allreduce import free_ports
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.settings import fields
from keras_lars.tools.train.config import Config
from keras_lars.tools.train.process_start import shared_settings
from tests.handshake import in_thread


# --- the settings every process shares -----------------------------------------------
def test_shared_settings_are_every_setting_not_declared_per_process():
    declared = {f.name for f in fields(Config) if f.metadata["per_process"]}
    assert {"process_id", "coordinator_address", "worker_start_timeout_minutes"} <= declared
    assert "log_every_seconds" in declared and "model_dir" not in declared
    shared = shared_settings(Config(global_batch_size=64))
    assert set(shared) == {f"--{f.name}" for f in fields(Config) if f.name not in declared}
    assert shared["--global_batch_size"] == 64 and shared["--model_dir"] == "runs/digits"


def test_differences_name_each_setting_and_who_holds_which_value():
    assert rendezvous.differences({"a": {"--x": 1}, "b": {"--x": 1}}) == ""
    assert rendezvous.differences(
        {
            "worker 0": {"--x": 1, "--y": "sgd", "--z": [1, 2]},
            "worker 1": {"--x": 2, "--y": "sgd", "--z": [1, 2]},
            "worker 2": {"--x": 1, "--y": "lars"},
        }
    ) == (
        "--x: 1 on worker 0 and worker 2, 2 on worker 1; --y: sgd on worker 0 and worker 1, "
        "lars on worker 2; --z: [1, 2] on worker 0 and worker 1, (unset) on worker 2"
    )


# --- processes that disagree ---------------------------------------------------------
def _jax_config(port, **settings):
    return Config(
        backend="jax",
        distribution="data_parallel",
        coordinator_address=f"localhost:{port}",
        worker_start_timeout_minutes=1,
        **settings,
    )


@pytest.mark.parametrize(
    "settings, differ",
    [
        (
            [{"global_batch_size": 256}, {"global_batch_size": 512}],
            "--global_batch_size: 256 on process 0, 512 on process 1",
        ),
        (
            [{"num_processes": 2}, {"num_processes": 3}],
            "--num_processes: 2 on process 0, 3 on process 1",
        ),
    ],
)
def test_processes_that_disagree_stop_with_one_line_naming_the_settings(settings, differ):
    """Before: different batch sizes hung until killed; 2 against 3
    processes was accepted."""
    runtime_jax = pytest.importorskip("keras_lars.tools.train.runtime_jax")
    (port,) = free_ports(1)
    chief = _jax_config(port, process_id=0, **{"num_processes": 2, **settings[0]})
    peer = _jax_config(port, process_id=1, **{"num_processes": 2, **settings[1]})
    thread, outcome = in_thread(runtime_jax.meet_processes, chief)
    with pytest.raises(ConfigError) as refused:
        runtime_jax.meet_processes(peer)
    thread.join()
    assert str(refused.value) == (
        f"--num_processes={peer.num_processes} --process_id=1: process 0 at localhost:{port} "
        f"refused process 1: settings differ: {differ}"
    )
    assert isinstance(outcome[0], ConfigError)
    assert str(outcome[0]) == f"--num_processes=2 --process_id=0: settings differ: {differ}"


def test_a_process_beyond_the_chiefs_count_is_refused():
    runtime_jax = pytest.importorskip("keras_lars.tools.train.runtime_jax")
    (port,) = free_ports(1)
    chief = _jax_config(port, num_processes=2, process_id=0)
    thread, _ = in_thread(runtime_jax.meet_processes, chief)
    with pytest.raises(ConfigError) as refused:
        runtime_jax.meet_processes(_jax_config(port, num_processes=3, process_id=2))
    assert str(refused.value) == (
        f"--num_processes=3 --process_id=2: process 0 at localhost:{port} refused process 2: "
        "process 2 is not a task of this run (process 0, process 1)"
    )
    runtime_jax.meet_processes(_jax_config(port, num_processes=2, process_id=1))
    thread.join()


def test_a_coordinator_address_that_cannot_be_held_is_not_blamed_on_the_timeout():
    """Before: "cannot join the other processes within
    --worker_start_timeout_minutes=1: ..." for causes not about time."""
    runtime_jax = pytest.importorskip("keras_lars.tools.train.runtime_jax")
    (port,) = free_ports(1)
    with socket.create_server(("localhost", port)):
        with pytest.raises(ConfigError) as taken:
            runtime_jax.meet_processes(_jax_config(port, num_processes=2, process_id=0))
    assert str(taken.value).startswith(
        f"--coordinator_address=localhost:{port} --num_processes=2 --process_id=0: cannot "
        f"listen on this task's address localhost:{port}: "
    )
    with pytest.raises(ConfigError) as malformed:
        runtime_jax.meet_processes(
            Config(backend="jax", coordinator_address="localhost:abc", num_processes=2)
        )
    assert str(malformed.value) == (
        "--coordinator_address=localhost:abc --num_processes=2 --process_id=0: "
        "'localhost:abc' is not host:port"
    )
