"""The warm pool with real sandboxes: lending, replacement, threads, asyncio, cleanup.

Process sandboxes throughout (fast); the parallel test runs on Docker too where an engine answers.
Every pool's sandboxes start with this session's PYTHONHASHSEED marker, so that a leak shows.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from envforge.contract import Limits
from envforge.errors import EnvCallError, SandboxCrashed, SandboxTimeout, SandboxUnavailable, UsageError
from sandbox.pool import SandboxPool
from sandbox.process import ProcessBackend
from tests.test_sandbox import GOOD_ENV, MARK, children, env_with, processes_marked

FAST = Limits(call_timeout_s=1.0, memory_mb=512)
TALK = {"role": "assistant", "content": "hello"}


@pytest.fixture
def pool():
    """pool(source=GOOD_ENV, size=2, backend="process", **options) -> a started pool, closed
    after the test; then no sandbox process may be left."""
    made, before = [], children()

    def pool(source=GOOD_ENV, size=2, backend="process", **options):
        p = SandboxPool(source, size=size, backend=backend, limits=options.pop("limits", FAST),
                        hash_seed=MARK, **options)
        made.append(p)
        return p
    yield pool
    for p in made:
        p.close()
    assert processes_marked() == [], "a pooled sandbox outlived its pool"
    assert children() - before == set(), "a child process of the test leaked"


def episode(lease, seed: int) -> float:
    """The reference solution of ``seed`` played on a lease; returns the score."""
    plan = lease.solve(seed)
    lease.reset(seed)
    score = 0.0
    for action in plan:
        obs, reward, terminated, truncated, info = lease.step(action)
        score += reward
        if terminated or truncated:
            break
    return score


def test_acquire_from_a_warm_pool_is_fast_and_reuses_sandboxes(pool):
    p = pool(size=2)
    p.wait_warm(timeout=30)
    times, seen = [], set()
    for seed in range(6):
        t = time.perf_counter()
        lease = p.acquire()
        times.append(time.perf_counter() - t)
        with lease:
            assert episode(lease, seed) == 1.0
            seen.add(id(lease.sandbox))
    assert max(times) < 0.05
    assert len(seen) <= 2 and p.started == 2 and p.replaced == 0
    assert "started=2" in repr(p)


def test_a_dead_sandbox_is_replaced_and_an_env_error_is_not(pool):
    p = pool(env_with(step="if action.get('content') == 'hang':\n    while True:\n        pass\n"
                           "if action.get('content') == 'raise':\n    raise KeyError('boom')\n"
                           "return {'messages': []}, 0.0, False, False, {}"), size=1)
    with p.acquire() as lease:
        lease.reset(1)
        with pytest.raises(EnvCallError, match="KeyError"):
            lease.step({"role": "assistant", "content": "raise"})
        first = lease.sandbox
    with p.acquire() as lease:
        assert lease.sandbox is first and p.replaced == 0  # an env error: the sandbox lives
        lease.reset(1)
        with pytest.raises(SandboxTimeout):
            lease.step({"role": "assistant", "content": "hang"})
    with p.acquire(timeout=30) as lease:
        assert lease.sandbox is not first and p.replaced == 1
        lease.reset(2)
        assert lease.step(TALK)[1:4] == [0.0, False, False]


def test_parallel_rollouts_from_threads(pool):
    p = pool(size=2)
    scores, errors = [], []

    def rollouts(worker: int) -> None:
        try:
            for k in range(5):
                with p.acquire(timeout=30) as lease:
                    scores.append(episode(lease, 10 * worker + k))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=rollouts, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and scores == [1.0] * 20
    assert p.started <= 2 and p.replaced == 0


def test_parallel_rollouts_on_docker(pool):
    from tests import test_docker
    if test_docker.REASON is not None:
        pytest.skip(f"no Docker engine: {test_docker.REASON}")
    test_docker.ensure_image()
    p = pool(size=2, backend=test_docker.backend())
    results = []

    def worker(w: int) -> None:
        out = []
        for k in range(3):
            with p.acquire(timeout=60) as lease:
                out.append(episode(lease, 10 * w + k))
        results.append(out)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == [[1.0] * 3] * 3 and p.replaced == 0
    p.close()
    assert test_docker.containers() == []


def test_async_acquire(pool):
    p = pool(size=2)

    async def rollout(seed: int) -> float:
        lease = await p.acquire_async(timeout=30)
        try:
            return await asyncio.to_thread(episode, lease, seed)
        finally:
            lease.release()

    async def main() -> list[float]:
        return await asyncio.gather(*(rollout(s) for s in range(6)))

    assert asyncio.run(main()) == [1.0] * 6


def test_a_cancelled_async_wait_hands_the_sandbox_back(pool):
    p = pool(size=1)
    held = p.acquire(timeout=30)

    async def main() -> None:
        task = asyncio.ensure_future(p.acquire_async(timeout=5))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        held.release()  # the cancelled wait gets it, then gives it back

    asyncio.run(main())
    with p.acquire(timeout=5) as lease:
        assert lease.sandbox is held.sandbox


def test_acquire_times_out_when_all_are_lent(pool):
    p = pool(size=1)
    with p.acquire(timeout=30):
        with pytest.raises(TimeoutError, match=r"no sandbox came free within 0.1 s \(pool size 1\)"):
            p.acquire(timeout=0.1)


def test_max_uses_retires_a_sandbox(pool):
    p = pool(size=1, max_uses=2)
    firsts = []
    for _ in range(3):
        with p.acquire(timeout=30) as lease:
            firsts.append(lease.sandbox)
    assert firsts[0] is firsts[1] is not firsts[2] and p.replaced == 1


def test_an_env_that_cannot_load_fails_the_pool_with_the_reason(pool):
    p = pool("raise ValueError('broken at import')\n", size=2)
    with pytest.raises(SandboxUnavailable, match=r"^the pool could not start a sandbox 3 times in "
                                                 r"a row: ValueError: broken at import$"):
        p.acquire(timeout=30)
    with pytest.raises(SandboxUnavailable, match="3 times in a row"):
        p.acquire(timeout=1)


class FailsAfter(ProcessBackend):
    """A process backend whose starts fail after the first ``n``."""

    def __init__(self, n: int):
        super().__init__()
        self.left = n

    def start(self, limits, hash_seed=0):
        self.left -= 1
        if self.left < 0:
            raise SandboxUnavailable("no more sandboxes")
        return super().start(limits, hash_seed=hash_seed)


def test_a_lent_sandbox_outlives_the_pool_giving_up(pool):
    """Sandboxes die with the thread that started them: the pool's thread must stay after it
    gave up starting more, until close()."""
    p = pool(size=2, backend=FailsAfter(1))
    with p.acquire(timeout=30) as lease:
        with pytest.raises(SandboxUnavailable, match="3 times in a row: no more sandboxes"):
            p.acquire(timeout=30)
        time.sleep(0.3)  # a thread that ended would have taken its sandbox with it by now
        assert lease.sandbox.ping() and episode(lease, 1) == 1.0
    assert p._thread.is_alive()
    p.close()
    assert not p._thread.is_alive()


def test_wait_warm_counts_lent_sandboxes(pool):
    p = pool(size=2)
    with p.acquire(timeout=30):
        p.wait_warm(timeout=30)  # one lent, one idle: both warm
    p.close()
    with pytest.raises(SandboxUnavailable, match="the pool is closed"):
        p.wait_warm(timeout=1)


def test_close_kills_lent_sandboxes_too(pool):
    p = pool(size=2)
    lease = p.acquire(timeout=30)
    p.close()
    with pytest.raises(SandboxCrashed, match="closed or killed earlier"):
        lease.reset(1)
    lease.release()
    with pytest.raises(SandboxUnavailable, match="the pool is closed"):
        p.acquire()
    p.close()  # idempotent


def test_a_pool_needs_a_size():
    with pytest.raises(UsageError, match="a pool needs at least one sandbox, got size=0"):
        SandboxPool(GOOD_ENV, size=0)


#: an env whose step answers by its action: "boom" raises, "die" kills the runner, else an echo
BY_ACTION = env_with(step='''
content = action.get("content") or ""
if content == "boom":
    raise ValueError("boom")
if content == "die":
    import os
    os._exit(3)
if content == "hang":
    while True:
        pass
if content.startswith("sleep "):
    import time
    time.sleep(float(content[6:]))
if content == "big":  # a reply too long for the shared memory: it comes on the pipe
    return {"messages": [{"role": "user", "content": "x" * (3 << 19)}]}, 0.0, False, False, {}
if content == "huge reward":
    return {"messages": []}, 10 ** 400, False, False, {}
return {"messages": [{"role": "user", "content": "echo " + content}]}, 0.0, False, False, {}
''')


def say(text: str) -> dict:
    return {"role": "assistant", "content": text}


def leases_of(p, n: int) -> list:
    leases = [p.acquire(timeout=30) for _ in range(n)]
    for i, lease in enumerate(leases):
        lease.reset(i)
    return leases


def test_call_all_sends_every_request_before_reading_a_reply(pool):
    p = pool(BY_ACTION, size=3)
    leases = leases_of(p, 3)
    events = []
    for i, lease in enumerate(leases):  # a spy on each real transport: what crosses, in order
        transport = lease.sandbox.transport
        send, recv = transport.send, transport.recv_line
        transport.send = lambda data, deadline, i=i, send=send: (events.append(("send", i)),
                                                                  send(data, deadline))[1]
        transport.recv_line = lambda *a, i=i, recv=recv: (events.append(("recv", i)), recv(*a))[1]
    answers = p.call_all([(lease, "step", say(f"hi {i}")) for i, lease in enumerate(leases)])
    assert [obs["messages"][0]["content"] for obs, *_ in answers] == ["echo hi 0", "echo hi 1",
                                                                      "echo hi 2"]
    assert events == [("send", 0), ("send", 1), ("send", 2), ("recv", 0), ("recv", 1), ("recv", 2)]
    with pytest.raises(ValueError, match="one call per sandbox"):
        p.call_all([(leases[0], "step", say("a")), (leases[0], "step", say("b"))])


def test_call_all_gives_each_call_its_own_error_and_spares_the_others(pool):
    p = pool(BY_ACTION, size=3)
    leases = leases_of(p, 3)
    ok, boom, died = p.call_all([(leases[0], "step", say("fine")), (leases[1], "step", say("boom")),
                                 (leases[2], "step", say("die"))])
    assert ok[0]["messages"][0]["content"] == "echo fine"
    assert isinstance(boom, EnvCallError) and "boom" in str(boom)
    assert isinstance(died, SandboxCrashed) and "step" in str(died)
    assert [lease.sandbox.closed for lease in leases] == [False, False, True]
    assert leases[1].step(say("again"))[0]["messages"][0]["content"] == "echo again"  # lives on
    for lease in leases:
        lease.release()
    assert p.replaced == 1


def test_an_interrupt_in_call_all_kills_the_sandboxes_whose_replies_were_not_read(pool):
    from sandbox.base import calls_in_flight
    p = pool(BY_ACTION, size=3)
    leases = leases_of(p, 3)

    def interrupted(*a):
        raise KeyboardInterrupt
    leases[1].sandbox.transport.recv_line = interrupted
    with pytest.raises(KeyboardInterrupt):
        p.call_all([(lease, "step", say("x")) for lease in leases])
    # the first reply was read: that sandbox is in step; the other two would answer out of step
    assert [lease.sandbox.closed for lease in leases] == [False, True, True]
    assert calls_in_flight() == 0
    assert leases[0].step(say("y"))[0]["messages"][0]["content"] == "echo y"
    for lease in leases:
        lease.release()


def test_a_hung_sandbox_in_call_all_does_not_time_out_the_others(pool):
    """call_all reads the replies one after another: one sandbox that hangs for its whole call
    time must not make the others' replies, which came in time, count as late (an attack: one
    env could kill the sandboxes of every episode stepped beside it)."""
    p = pool(BY_ACTION, size=3)
    leases = leases_of(p, 3)
    hung, big, small = p.call_all([(leases[0], "step", say("hang")), (leases[1], "step", say("big")),
                                   (leases[2], "step", say("small"))])
    assert isinstance(hung, SandboxTimeout)
    assert len(big[0]["messages"][0]["content"]) == 3 << 19
    assert small[0]["messages"][0]["content"] == "echo small"
    assert [lease.sandbox.closed for lease in leases] == [True, False, False]
    for lease in leases:
        lease.release()


def test_replies_read_late_share_one_window_past_their_limit(pool, monkeypatch):
    """After a hung sandbox, the late replies get LATE_READ_S in all, not each from its own read
    (else each of N sandboxes could run LATE_READ_S longer than the one before it)."""
    import sandbox.base
    monkeypatch.setattr(sandbox.base, "LATE_READ_S", 0.5)
    p = pool(BY_ACTION, size=4)  # call time 1 s: the window after the hung one ends near 1.5 s
    leases = leases_of(p, 4)
    # read each from the last one's reply, with a window each, all three would be in time
    out = p.call_all([(leases[0], "step", say("hang")), (leases[1], "step", say("sleep 1.2")),
                      (leases[2], "step", say("sleep 1.6")), (leases[3], "step", say("sleep 1.95"))])
    assert isinstance(out[0], SandboxTimeout)
    assert out[1][0]["messages"][0]["content"] == "echo sleep 1.2"
    assert isinstance(out[2], SandboxTimeout) and isinstance(out[3], SandboxTimeout)
    for lease in leases:
        lease.release()


def test_slow_kills_of_failed_sandboxes_do_not_eat_the_others_time(pool):
    """A runner that holds much memory takes a while to die: call_all kills the sandboxes that
    failed once every reply is read, so a lane's hung members cannot make its well-behaved
    members' replies, which came in time, count as late. On the pipe channel (the shared
    memory's would hand over a reply that is in, however late it is read)."""
    p = pool(BY_ACTION, size=4, backend=ProcessBackend(channel="pipe"))
    leases = leases_of(p, 4)
    events = []
    for i, lease in enumerate(leases):
        transport = lease.sandbox.transport
        if i < 2:  # a real kill, made slow (as a large runner's is)
            transport.kill = lambda i=i, kill=transport.kill: (time.sleep(0.4),
                                                               events.append(("kill", i)), kill())
        else:
            transport.recv_line = lambda *a, i=i, recv=transport.recv_line: (
                events.append(("read", i)), recv(*a))[1]
    out = p.call_all([(leases[0], "step", say("hang")), (leases[1], "step", say("hang")),
                      (leases[2], "step", say("a")), (leases[3], "step", say("b"))])
    assert isinstance(out[0], SandboxTimeout) and isinstance(out[1], SandboxTimeout)
    assert [o[0]["messages"][0]["content"] for o in out[2:]] == ["echo a", "echo b"]
    assert events == [("read", 2), ("read", 3), ("kill", 0), ("kill", 1)]  # killed at the end
    assert [lease.sandbox.closed for lease in leases] == [True, True, False, False]
    for lease in leases:
        lease.release()


def test_a_long_reply_read_just_before_its_limit_gets_the_late_window(pool):
    """A member that answers just inside its limit, then one whose long reply (past the shared
    memory: on the pipe, which nobody read meanwhile) is still to come: the second must not time
    out for want of the milliseconds left to read it."""
    p = pool(BY_ACTION, size=2)
    for _ in range(3):
        leases = leases_of(p, 2)
        out = p.call_all([(leases[0], "step", say("sleep 0.995")), (leases[1], "step", say("big"))])
        assert not isinstance(out[1], Exception), out[1]
        assert len(out[1][0]["messages"][0]["content"]) == 3 << 19
        for lease in leases:
            lease.release()


def test_a_slow_call_checks_the_cpu_used_since_the_last_mark(pool):
    """After a call of REMARK_S or more the host reads the sandbox's CPU clock afresh; it must
    check what was used since the last reading too, not just start over (else an env that keeps
    its calls slow, or has a slow neighbour in call_all, would be forgiven CPU burnt between
    calls). The CPU reading is a spy on the real one, adding 5 s used while no call ran."""
    p = pool(BY_ACTION, size=1)
    lease = leases_of(p, 1)[0]
    transport = lease.sandbox.transport
    if transport.cpu_seconds() is None:
        pytest.skip("this transport cannot read its sandbox's CPU time")
    extra = [0.0]
    transport.cpu_seconds = lambda read=transport.cpu_seconds: read() + extra[0]
    lease.step(say("sleep 0.02"))  # slow: the clock is marked
    extra[0] = 5.0
    with pytest.raises(SandboxCrashed, match="CPU seconds between calls"):
        lease.step(say("sleep 0.02"))
    assert lease.sandbox.closed
    lease.release()
