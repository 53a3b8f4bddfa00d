"""torch.distributed for `yt8m train`, `eval` and `predict`: the process group from torchrun's environment (gloo on
CPU, NCCL on CUDA), the few collectives they need, and the torchrun command line behind --num_gpu.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import logging
import os
import shlex
import sys
import time
import uuid
from typing import Any, Callable, Iterable, Iterator, NoReturn, Optional, Sequence

import torch
import torch.distributed as dist

from yt8m.fields import setting
from yt8m.runtime import DEVICE_HELP, device_problem, resolve_device

log = logging.getLogger("yt8m.distributed.ranks")

# Rank 0 evaluates the validation set after checkpoints while the other ranks wait in a collective, so the
# timeout must outlast a full evaluation pass; a dead peer is still caught at once by torchrun's agent.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)


def launched_by_torchrun() -> bool:
    """True inside a process started by torchrun (or any launcher that sets its env:// variables)."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def rank_and_world_size() -> tuple[int, int]:
    """(rank, world_size) of the initialized process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def env_rank() -> int:
    """This process's rank as torchrun announces it, readable before the process group exists."""
    return int(os.environ.get("RANK", "0"))


def device_setting() -> Any:
    """The `device` setting of every command that runs a model (train, eval, predict, ensemble)."""
    return setting("auto", DEVICE_HELP, check=device_problem)


def training_device(name: str) -> torch.device:
    """--device resolved for this process: under torchrun, 'auto' and 'cuda' mean cuda:LOCAL_RANK."""
    device = resolve_device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[None]:
    """Join torchrun's process group for the duration (NCCL for CUDA, gloo otherwise), then leave it.

    Outside torchrun, or when the caller already initialized one, nothing is set up or torn down.
    """
    if not launched_by_torchrun() or dist.is_initialized():
        yield
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    store, rank, world_size = next(dist.rendezvous("env://", timeout=COLLECTIVE_TIMEOUT))
    dist.init_process_group(backend, store=attempt_store(store, rank, world_size), rank=rank,
                            world_size=world_size, timeout=COLLECTIVE_TIMEOUT,
                            device_id=device if device.type == "cuda" else None)
    log.info("process %d of %d joined the %s process group", dist.get_rank(), dist.get_world_size(), backend)
    try:
        yield
    finally:
        dist.destroy_process_group()


def attempt_store(store: dist.Store, rank: int, world_size: int) -> dist.Store:
    """`store` under keys of this attempt alone, named by rank 0.

    After a worker failure torchrun restarts every process against the same store, where the previous attempt's
    connection addresses would still be found. TORCHELASTIC_RESTART_COUNT cannot name the attempt: each node's
    agent counts only its own workers' failures, so after a kill on one node the nodes' counts differ and the
    processes would wait under different keys. Each process asks under a fresh random key instead, which no earlier
    attempt can have answered.
    """
    if rank == 0:
        name = uuid.uuid4().hex
        answer_until_acknowledged(store, name, world_size)
    else:
        question = uuid.uuid4().hex
        store.set(f"yt8m/question-{rank}", question)
        name = store.get(f"yt8m/answer-{question}").decode()
        store.set(f"yt8m/attempt-{name}/acknowledged-{rank}", "1")
    return dist.PrefixStore(f"yt8m/attempt-{name}", store)


def answer_until_acknowledged(store: dist.Store, name: str, world_size: int) -> None:
    """Rank 0: answer every other process's latest question with `name` until each acknowledges it; a question
    read before its process asked again is an earlier attempt's, and its answer goes unread."""
    waiting = set(range(1, world_size))
    while waiting:
        for peer in waiting:
            store.set(f"yt8m/answer-{store.get(f'yt8m/question-{peer}').decode()}", name)
        time.sleep(0.01)
        waiting = {peer for peer in waiting if not store.check([f"yt8m/attempt-{name}/acknowledged-{peer}"])}


def all_reduce_sum(value: int, device: torch.device) -> int:
    """The sum of `value` over all processes (the value itself in one process)."""
    return all_reduce_sums([value], device)[0]


def all_reduce_sums(values: Sequence[int], device: torch.device) -> list[int]:
    """The sums of `values` over all processes, in one collective (the values themselves in one process)."""
    if rank_and_world_size()[1] == 1:
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [int(value) for value in tensor.tolist()]


def all_gathered(value: Any) -> list[Any]:
    """Every process's `value` (picklable), in rank order ([value] in one process)."""
    if rank_and_world_size()[1] == 1:
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def broadcast_from_rank0(values: Sequence[float], device: torch.device) -> list[float]:
    """Rank 0's `values` on every process (all must pass the same length)."""
    if rank_and_world_size()[1] == 1:
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=0)
    return tensor.tolist()


class _EndOfStream:
    """What `send_stream` sends last."""


def send_stream(objects: Iterable[Any]) -> None:
    """Send `objects` to rank 0 one at a time (pickled), then an end mark: rank 0 reads them with receive_stream."""
    for item in itertools.chain(objects, [_EndOfStream()]):
        dist.send_object_list([item], dst=0)


def receive_stream(source: int) -> Iterator[Any]:
    """Rank 0: the objects `source` sends with send_stream, as they come; the stream must be read to its end."""
    while True:
        box: list[Any] = [None]
        dist.recv_object_list(box, src=source)
        if isinstance(box[0], _EndOfStream):
            return
        yield box[0]


def decided_by_rank0(decide: Callable[[], Any]) -> Any:
    """`decide()` run on rank 0 and its value (picklable) handed to every process. An exception it raises is
    raised on rank 0, and the others stop with a RuntimeError quoting it rather than wait for a value. Called by
    all; without a process group, just `decide()`."""
    if rank_and_world_size()[1] == 1:
        return decide()
    box: list[Any] = [None]
    error: Optional[Exception] = None
    if dist.get_rank() == 0:
        try:
            box[0] = (decide(), None)
        except Exception as raised:
            error = raised
            box[0] = (None, f"{type(raised).__name__}: {raised}")  # text: not every exception can be pickled
    dist.broadcast_object_list(box, src=0)
    value, failure = box[0]
    if error is not None:
        raise error
    if failure is not None:
        raise RuntimeError(f"process 0 failed: {failure}")
    return value


def barrier() -> None:
    if rank_and_world_size()[1] > 1:
        dist.barrier()


def exit_without_teardown(code: int = 0) -> NoReturn:
    """End a torchrun worker that finished cleanly without the interpreter's teardown. gloo's worker threads may
    still be releasing the last collectives' tensors then, and a thread that needs the GIL while the interpreter
    finalizes aborts the process (SIGABRT, "terminate called without an active exception"; a core dump showed
    ProcessGroupGloo::runLoop destroying the final barrier's work), which torchrun reports as a failed run: 3 of
    19 full test runs on 2 cores. By now every file the run writes is closed; streams and logging are
    flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def torchrun_command(train_argv: Sequence[str], processes: int) -> list[str]:
    """The torchrun command line that runs `yt8m train train_argv` as `processes` processes on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
            "-m", "yt8m", "train", *train_argv]


def relaunch_for_gpus(train_argv: Sequence[str], num_gpu: int) -> None:
    """--num_gpu N > 1 outside torchrun: replace this process with torchrun running N processes, one per GPU."""
    command = torchrun_command(train_argv, num_gpu)
    printable = shlex.join(["torchrun", *command[3:]])
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available < num_gpu:
        raise ValueError(f"--num_gpu {num_gpu}: this machine has {available} CUDA GPU(s). To train "
                         f"{num_gpu} processes anyway (gloo on CPU), run:\n  {printable}")
    log.info("--num_gpu %d: relaunching as %s", num_gpu, printable)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)
