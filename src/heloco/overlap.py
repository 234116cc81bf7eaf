"""The overlapped exchange: a worker pushes Δ and pulls its next dispatch while it trains on.

Blocking (the default): pull D_k → H steps from θ(D_k) → push Δ_k → wait for the ack → pull
D_{k+1}. The link is idle while the worker trains and the worker idles while the link works.

Overlapped, after the one-step-delayed "eager" updates of Kale et al. 2025 ("Eager Updates
For Overlapped Communication and Computation in DiLoCo", arXiv 2502.12996: the worker's own
fresh outer gradient stands in for the one still being exchanged; there, in a synchronous
outer step, weighted 1/M beside the delayed average of the others; here, where a server
applies each arrival alone, weighted λ), with the exchange given one whole round (Streaming
DiLoCo's overlap τ = H, Douillard et al. 2025, arXiv 2501.18512). Round 0 trains from
D_0 as in blocking. At the end of round k (Δ_k = start_k − θ_local, the compressed Δ when a
payload is set):

1. wait for D_k, the dispatch pulled in the background during round k (round 0: D_0 is
   already there), and for the ack of the push of Δ_{k−1} that preceded it;
2. start, in the background, push Δ_k then pull D_{k+1};
3. begin round k+1 at once from **start_{k+1} = θ(D_k) − λ·Δ_k**, for D_k.steps inner steps.

θ(D_k) holds every update the server had applied when it answered, which includes Δ_{k−1}
but not Δ_k (still in flight). λ = ``overlap_eager`` says how much of its own newest Δ the
worker applies itself in the meantime: λ = 1 is the eager update (round k+1 starts from the
worker's own end point moved by the global progress since round k began:
θ(D_k) − Δ_k = θ_local + (θ(D_k) − start_k)), λ = 0 the plain one-step delay (train from the
newest global model, one round behind its own work). The local λ·Δ_k is a look-ahead only:
round k+1's Δ is measured from start_{k+1}, so Δ_k reaches the server once, through the push,
and the next dispatch, which holds it as the outer optimizer applied it, replaces it.

Round k+1 answers dispatch D_{k+1}: its push carries D_{k+1}'s round id (one push per
dispatch, exactly once, as in blocking) and, as its base revision, D_k's revision (the
newest global state its start holds). A server in overlapped mode
(``ServerConfig.overlapped``) accepts either the outstanding dispatch's revision (a first
round, or a blocking worker) or the one before it, and at most the steps of either.

Staleness. Δ_{k+1}'s staleness is counted from D_k, so every overlapped round is about one
round of updates staler than its blocking counterpart (the updates applied while D_{k+1}
travelled and round k+1 ran). The HeLoCo correction and the delayed-Nesterov methods see this
honestly: they get the server's revision minus that base revision, as for any stale Δ. DyLU
sees each round's measured speed (steps / compute seconds) as in blocking; a dispatch's step
count H_w applies to the round trained from it (round k+1 uses D_k.steps), one round later
than in blocking.

A push the server refuses as ``evicted`` (the worker was silent too long) is answered by a
fresh dispatch, which takes only a round based on its own revision: when it is newer than
the round in training's base, that round is dropped and a first round starts from it
(:class:`heloco.outer_loop.OuterLoop`), as after a restart.

Nothing else changes: the simulator (:mod:`heloco.sim.loop`) and the networked worker
(:class:`heloco.outer_loop.OuterLoop`) both build each round's start with
:func:`overlapped_dispatch`, so one config and seed gives the same losses either way.
"""

from __future__ import annotations

from typing import Literal

import torch

from heloco.types import Delta, Dispatch, Params

Exchange = Literal["blocking", "overlapped"]
EXCHANGES: tuple[str, ...] = ("blocking", "overlapped")


@torch.no_grad()
def eager_start(params: Params, delta: Delta, eager: float) -> Params:
    """start = θ − λ·Δ per tensor (fp32, CPU): the dispatch ``params`` with ``eager`` (λ) of
    the worker's own in-flight ``delta`` applied (module docstring, step 3)."""
    if eager == 0.0:
        return {k: v.clone() for k, v in params.items()}
    return {k: v - eager * delta[k].to(v.dtype) for k, v in params.items()}


def overlapped_dispatch(
    latest: Dispatch, delta: Delta, eager: float, answers: Dispatch | None = None
) -> Dispatch:
    """The round that trains while Δ (``delta``) is in flight, as a dispatch: it starts from
    :func:`eager_start` of the ``latest`` dispatch received, for ``latest.steps`` steps, with
    ``latest``'s revision as its base; ``answers`` (the dispatch pulled in the background,
    once it is known) gives the round id its push carries."""
    round_id = answers.round_id if answers is not None else -1
    return Dispatch(
        eager_start(latest.params, delta, eager),
        latest.revision,
        latest.steps,
        round_id,
        latest.worker,
    )
