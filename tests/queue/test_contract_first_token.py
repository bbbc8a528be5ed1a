"""A request's first token is the first attempt's that made one, on every implementation: a
request evicted after its first token (the client saw that token) keeps its time through the
requeue, and the next pull hands it to the agent that finishes it (`Pulled.first_token_at_s`),
so that its result says when the client really got its first token. The simulator keeps a
request's first first token the same way (qlm/sim/simulation.py)."""

from __future__ import annotations

from qlm.queue.queue_protocol import GlobalQueue
from qlm.types import RequestState
from tests.queue.test_contract import enqueue_n, make, queue, rec

__all__ = ["make", "queue"]  # the fixtures, parametrized over the implementations
S = RequestState


async def test_the_first_attempts_first_token_survives_a_requeue(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 2)
    [first] = await queue.pull_counted("i0", ["r0"], lease_s=5.0, now_s=0.0)
    assert first.first_token_at_s is None  # no attempt made a token yet
    assert await queue.mark_running("r0", "i0", 1.25)
    assert (await rec(queue, "r0")).first_token_at_s == 1.25
    assert await queue.requeue("i0", ["r0"], evicted=True, now_s=2.0) == ("r0",)
    [again] = await queue.pull_counted("i1", ["r0"], lease_s=5.0, now_s=3.0)
    assert (again.dispatches, again.first_token_at_s) == (2, 1.25)
    assert await queue.mark_running("r0", "i1", 3.5)  # the second attempt's: not kept
    record = await rec(queue, "r0")
    assert (record.state, record.first_token_at_s) == (S.RUNNING, 1.25)


async def test_a_mark_without_a_time_or_by_another_keeps_none(queue: GlobalQueue) -> None:
    await enqueue_n(queue, 1)
    await queue.pull("i0", ["r0"], lease_s=5.0, now_s=0.0)
    assert not await queue.mark_running("r0", "i9", 0.5)  # not the holder: nothing kept
    assert await queue.mark_running("r0", "i0")  # no time given
    assert (await rec(queue, "r0")).first_token_at_s is None
    assert await queue.mark_running("r0", "i0", 0.75)  # already RUNNING: the time is kept
    assert (await rec(queue, "r0")).first_token_at_s == 0.75
