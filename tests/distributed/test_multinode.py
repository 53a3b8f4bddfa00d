"""Multi-node training on loopback: two torchrun agents (`--nnodes 2`, one process each) meeting through c10d
rendezvous on 127.0.0.1 train as the 1-node, 2-process job does, and restart together after a killed worker.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from test_distributed import TRAIN_VIDEOS, config_values, finish, start_torchrun, uneven_data, worker_pids  # noqa: F401

from workflow_fixtures import as_flags
from yt8m.io.checkpoints import final_checkpoint, list_checkpoints, load_checkpoint

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_node(values: dict, node_rank: int, port: int, *torchrun_flags: str) -> subprocess.Popen:
    """One node of a 2-node job: its own torchrun agent with one worker; node 0's agent hosts the rendezvous store.
    c10d rendezvous deals out the ranks itself (torchrun ignores --node_rank with it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "yt8m-loopback",
               "--rdzv_conf", f"is_host={node_rank == 0}", *torchrun_flags,
               "-m", "yt8m", "train", *as_flags(values)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def start_two_nodes(values: dict, *torchrun_flags: str) -> list[subprocess.Popen]:
    port = free_port()
    return [start_node(values, node_rank, port, *torchrun_flags) for node_rank in (0, 1)]


def finish_nodes(nodes: list[subprocess.Popen], timeout: float = 150) -> tuple[dict, str]:
    """(the summary that rank 0 printed, on whichever node it ran; both nodes' stderr)."""
    try:
        outputs = [node.communicate(timeout=timeout) for node in nodes]
    finally:  # a hung job must not outlive the test: each agent leads a process group with its worker
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    errors = "\n".join(err for _, err in outputs)
    assert [node.returncode for node in nodes] == [0, 0], errors[-4000:]
    printed = [out for out, _ in outputs if out]
    assert len(printed) == 1 and len(printed[0].splitlines()) == 1, outputs  # rank 0 alone prints the summary
    return json.loads(printed[0]), errors


def test_two_nodes_train_as_two_processes_on_one_node(uneven_data, tmp_path):
    one_node, two_nodes = tmp_path / "one_node", tmp_path / "two_nodes"
    reference, _ = finish(start_torchrun(config_values(uneven_data, one_node)))
    summary, _ = finish_nodes(start_two_nodes(config_values(uneven_data, two_nodes)))

    assert summary["processes"] == reference["processes"] == 2
    assert summary["global_step"] == reference["global_step"] and summary["examples"] == 2 * TRAIN_VIDEOS
    assert summary["loss"] == pytest.approx(reference["loss"], abs=1e-5)
    expected = load_checkpoint(final_checkpoint(str(one_node))).model
    trained = load_checkpoint(final_checkpoint(str(two_nodes))).model
    assert trained.keys() == expected.keys()
    for name, weights in expected.items():
        torch.testing.assert_close(trained[name], weights, atol=1e-5, rtol=0, msg=name)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="finds torchrun's workers through /proc")
def test_a_killed_worker_restarts_both_nodes_from_the_last_checkpoint(uneven_data, tmp_path):
    train_dir = tmp_path / "run"
    values = config_values(uneven_data, train_dir, batch_size=8, num_epochs=20, export_model_steps=20)
    nodes = start_two_nodes(values, "--max-restarts", "1")
    first = train_dir / "checkpoints" / "ckpt-00000020.pt"
    deadline = time.monotonic() + 90
    while not first.exists() and all(node.poll() is None for node in nodes) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert first.exists()
    os.kill(worker_pids(nodes[1].pid)[0], signal.SIGKILL)
    summary, err = finish_nodes(nodes)

    sizes = uneven_data["shard_sizes"]
    steps_per_epoch = math.ceil((sizes[0] + sizes[2]) / 8)
    assert "resuming from" in err and err.count("process 0 of 2 joined") == 2, err[-4000:]  # a new 2-process group
    assert summary["global_step"] == 20 * steps_per_epoch and summary["examples"] == 20 * TRAIN_VIDEOS
    assert final_checkpoint(str(train_dir)).endswith(f"ckpt-{summary['global_step']:08d}.pt")
    assert [step for step, _ in list_checkpoints(str(train_dir))][-1] == summary["global_step"]
