"""Where a grid's tasks run: in this process, a local process pool, or a Ray cluster.

Every executor runs the same task function on the same arguments and yields its outcomes as
they finish, so a grid writes the same files whichever ran it (each cell sets its own torch
thread count from its config, so the losses are the same too). Ray is an optional extra
(``pip install -e '.[ray]'``), imported only when chosen. Its tasks write their run folders
themselves: on a multi-machine cluster the output folder must be on storage every node sees
at the same path.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, TypeVar

from shardmeter.errors import UserInputError

Executor = Literal["local", "ray"]
EXECUTORS: tuple[Executor, ...] = ("local", "ray")
T = TypeVar("T")
R = TypeVar("R")


def run_tasks(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    executor: Executor = "local",
    jobs: int = 2,
    init: Callable[[], None] | None = None,
    ray_address: str | None = None,
    cpus_per_task: float = 1.0,
) -> Iterator[R]:
    """``fn(task)`` for every task, yielded in order of completion.

    ``local``: ``jobs`` spawned processes (each running ``init`` first), or this process when
    ``jobs`` <= 1 or there is one task. ``ray``: Ray tasks of ``cpus_per_task`` CPUs each, on
    the cluster at ``ray_address`` or on a local Ray started with ``jobs`` CPUs (and shut down
    at the end); ``init`` runs at the start of every Ray task.
    """
    if executor not in EXECUTORS:
        raise UserInputError("executor", executor, " or ".join(EXECUTORS))
    if not tasks:
        return
    if executor == "ray":
        yield from _ray_tasks(fn, tasks, jobs, init, ray_address, cpus_per_task)
    elif jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield fn(task)
    else:
        ctx = mp.get_context("spawn")
        with ctx.Pool(jobs, init) as pool:
            yield from pool.imap_unordered(fn, tasks)


def _with_init(fn: Callable[[T], R], init: Callable[[], None] | None) -> Callable[[T], R]:
    def task(arg: T) -> R:
        if init is not None:
            init()
        return fn(arg)

    return task


def _ray_tasks(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    jobs: int,
    init: Callable[[], None] | None,
    address: str | None,
    cpus_per_task: float,
) -> Iterator[R]:
    try:
        import ray
    except ImportError:
        raise UserInputError(
            "executor", "ray", "install the extra first: pip install -e '.[ray]'"
        ) from None
    started = not ray.is_initialized()
    if started:
        cpus = None if address is not None else max(1, jobs)  # a cluster brings its own
        ray.init(address=address, num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=cpus_per_task, max_retries=0)(_with_init(fn, init))
        pending = [remote.remote(t) for t in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()
