"""envforge.make and the Gymnasium interface, over real sandboxes (process; Docker where an engine
answers): episodes, Gymnasium's own env checker, registration, the gate check before any code
runs, typed errors per episode and recovery, pools, and the unsafe in-process baseline."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import warnings

import pytest

gymnasium = pytest.importorskip("gymnasium", reason="gymnasium is not installed: pip install gymnasium")

import envforge  # noqa: E402
from envforge.errors import EnvCallError, InputError, SandboxTimeout, UsageError  # noqa: E402
from tests.envfactory import GOOD_DIR, good_source, override, variants, write_env  # noqa: E402
from tests.test_sandbox import MARK, children, processes_marked  # noqa: E402

SLUG = GOOD_DIR.name
FAST = {"call_timeout_s": 1.0, "memory_mb": 512}


@pytest.fixture
def no_leak():
    before = children()
    yield
    assert processes_marked() == [], "a sandboxed process outlived its env"
    assert children() - before == set(), "a child process of the test leaked"


def play(env, seed: int) -> tuple[float, bool, bool, int]:
    """The reference solution of ``seed``: (score, terminated, truncated, steps)."""
    plan = env.unwrapped.solve(seed)
    env.reset(seed=seed)
    score, steps = 0.0, 0
    for action in plan:
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs) and isinstance(info, dict)
        score, steps = score + reward, steps + 1
        if terminated or truncated:
            return score, terminated, truncated, steps
    return score, False, False, steps


def test_import_envforge_loads_neither_gymnasium_nor_docker():
    code = ("import sys, envforge; print('gymnasium' in sys.modules, 'docker' in sys.modules); "
            "envforge.make; print('gymnasium' in sys.modules, 'docker' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "True", "False"]


def test_make_by_slug_plays_an_episode(no_leak):
    env = envforge.make(SLUG, backend="process", hash_seed=MARK, **FAST)
    try:
        obs, info = env.reset(seed=3)
        assert [m["role"] for m in obs["messages"]][:2] == ["system", "user"] and "skill" in info
        assert play(env, 3)[:2] == (1.0, True)
        assert env.capability == "precondition verification" and env.max_turns == 12
        assert "get_ticket_details" in env.action_space.tool_names
    finally:
        env.close()
    env.close()  # idempotent


def test_gymnasiums_env_checker_passes(no_leak):
    from gymnasium.utils.env_checker import check_env
    env = gymnasium.make(f"envforge/{SLUG}", backend="process", hash_seed=MARK, **FAST)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped)
        assert [str(w.message) for w in caught] == []
        assert play(env, 5)[0] == 1.0  # through gymnasium's wrappers (passive checker, order)
    finally:
        env.close()


def test_registration_and_the_module_form(tmp_path):
    import envforge.gym as g
    assert f"envforge/{SLUG}" in g.REGISTERED and f"envforge/{SLUG}" in gymnasium.registry
    good = write_env(tmp_path / "fine_env", good_source())
    bad = write_env(tmp_path / "bad_env", good_source())
    (bad / "report.json").write_text(json.dumps({"verdict": "reject", "findings": []}))
    write_env(tmp_path / "not-a-slug-v1x", good_source())
    (tmp_path / "no_env_here").mkdir()
    assert g.register_envs([tmp_path]) == ["envforge/fine_env"]
    assert gymnasium.spec("envforge/fine_env").kwargs == {"path": str(good.resolve())}


def test_seed_none_continues_the_seeded_generator(no_leak):
    env = envforge.make(SLUG, backend="process", hash_seed=MARK, **FAST)
    try:
        env.reset(seed=11)
        a = [env.reset()[0] for _ in range(3)]
        env.reset(seed=11)
        b = [env.reset()[0] for _ in range(3)]
        assert a == b and a[0] != a[1]
    finally:
        env.close()


def test_seed_none_draws_from_the_audits_mix(no_leak):
    """An unseeded reset's env seed is of the mix the gate audits (half small, a quarter
    middling, a quarter large), as envforge's own training draws: uniform in [0, 2^31) it was
    nearly always large, so a flaw kept to large seeds met every episode and a quarter of the
    audit's seeds."""
    from envforge.contract import SMALL_SEEDS
    env = envforge.make(SLUG, backend="process", hash_seed=MARK, **FAST)
    try:
        env.reset(seed=3)
        seeds = [env._drawn_seed() for _ in range(2000)]
    finally:
        env.close()
    small = sum(s < SMALL_SEEDS for s in seeds) / len(seeds)
    large = sum(s >= 10**6 for s in seeds) / len(seeds)
    assert 0.45 < small < 0.55 and 0.2 < large < 0.3 and all(0 <= s < 2**31 for s in seeds)


def test_make_refuses_what_the_gate_rejects(tmp_path):
    rejected = write_env(tmp_path / "rejected", good_source())
    (rejected / "report.json").write_text(json.dumps({"verdict": "reject", "findings": [
        {"check": "solvability", "severity": "error", "message": "solve() reaches 0.2."}]}))
    with pytest.raises(InputError) as e:
        envforge.make(rejected, backend="process")
    assert str(e.value) == (f"{rejected} was rejected by the gate (report.json): solvability: "
                            "solve() reaches 0.2. Fix the env (or synthesize it again) and re-run "
                            f"`envforge audit {rejected}`")  # one period; no Python-only advice
    static = write_env(tmp_path / "static", good_source().replace("import json\n", "import json\nimport os\n"))
    with pytest.raises(InputError, match=r"static/env.py fails the gate's static audit \(1 errors; "
                                         r"first: static.import: .*'os'"):
        envforge.make(static, backend="process")
    env = envforge.make(static, backend="process", unsafe_skip_gate=True, hash_seed=MARK)
    assert env.reset(seed=1)[0]["messages"]
    env.close()


def test_make_says_where_it_looked_and_which_limits_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVFORGE_ENVS", str(tmp_path))
    with pytest.raises(UsageError, match=r"^no env 'nope': not a path, and no folder of that name "
                                         r"with an env.py in .*\(set ENVFORGE_ENVS to add folders\)$"):
        envforge.make("nope")
    write_env(tmp_path / "mine", good_source())
    env = envforge.make("mine", backend="process", hash_seed=MARK)  # found through ENVFORGE_ENVS
    env.close()
    with pytest.raises(UsageError, match="unexpected keyword argument 'memory'; limits are "
                                         "fields of envforge.contract.Limits"):
        envforge.make(SLUG, memory=3)


def test_step_outside_an_episode_is_a_usage_error(no_leak):
    env = envforge.make(SLUG, backend="process", hash_seed=MARK, **FAST)
    try:
        with pytest.raises(UsageError, match=r"^step\(\) before reset\(\), or after the episode"):
            env.step({"role": "assistant", "content": "hi"})
        assert play(env, 2)[1] is True
        with pytest.raises(UsageError, match="call reset"):
            env.step({"role": "assistant", "content": "hi"})
    finally:
        env.close()


@pytest.mark.parametrize("action, why", [
    ("hello", "a message must be a dict, got str"),
    ({"role": "user", "content": "hi"}, "got role 'user'"),
    ({"role": "robot", "content": "hi"}, "message role must be one of"),
    ({"role": "assistant", "content": 3}, "assistant content must be a string or null, got int"),
])
def test_an_action_that_is_not_an_assistant_message_is_refused(no_leak, action, why):
    env = envforge.make(SLUG, backend="process", hash_seed=MARK, **FAST)
    try:
        env.reset(seed=1)
        with pytest.raises(ValueError, match=r"^step\(action\): the action must be an assistant "
                                             r"message.*" + re.escape(why)):
            env.step(action)
        assert play(env, 1)[:2] == (1.0, True)  # the episode was not touched
    finally:
        env.close()


def test_the_host_truncates_at_max_turns(tmp_path, no_leak):
    never = next(v.source for v in variants() if v.name == "never_ends")
    env = envforge.make(write_env(tmp_path / "never", never), backend="process", hash_seed=MARK)
    try:
        env.reset(seed=1)
        flags = [env.step({"role": "assistant", "content": "hmm"})[2:4] for _ in range(env.max_turns)]
        assert flags[:-1] == [(False, False)] * (env.max_turns - 1) and flags[-1] == (False, True)
    finally:
        env.close()


@pytest.mark.parametrize("backend", ["process", "docker"])
def test_a_hung_sandbox_is_a_typed_error_and_the_next_reset_recovers(tmp_path, no_leak, backend):
    if backend == "docker":
        from tests import test_docker
        if test_docker.REASON is not None:
            pytest.skip(f"no Docker engine: {test_docker.REASON}")
        test_docker.ensure_image()
        backend = test_docker.backend()
    hang = next(v.source for v in variants() if v.name == "hang")
    env = envforge.make(write_env(tmp_path / "hang", hang), backend=backend, hash_seed=MARK, **FAST)
    try:
        env.reset(seed=1)
        first = env.unwrapped._sandbox
        with pytest.raises(SandboxTimeout, match="step did not answer within 1 s"):
            env.step({"role": "assistant", "content": "Is there anything else you need?"})
        assert first.closed and env.unwrapped._sandbox is None  # gone, not kept
        with pytest.raises(UsageError):
            env.step({"role": "assistant", "content": "hi"})
        assert play(env, 4)[0] == 1.0  # a fresh sandbox
        assert env.unwrapped._sandbox is not first
    finally:
        env.close()
    if not isinstance(backend, str):
        from tests.test_docker import containers
        assert containers() == []


def test_an_env_exception_ends_the_episode_but_not_the_sandbox(tmp_path, no_leak):
    crash = override("""
        def step(self, action):
            if action.get("content") == "boom":
                raise KeyError("boom")
            return _Base.step(self, action)
    """)
    env = envforge.make(write_env(tmp_path / "crash", crash), backend="process", hash_seed=MARK)
    try:
        env.reset(seed=1)
        sandbox = env.unwrapped._sandbox
        with pytest.raises(EnvCallError, match="KeyError: 'boom'"):
            env.step({"role": "assistant", "content": "boom"})
        env.reset(seed=1)
        assert env.unwrapped._sandbox is sandbox
    finally:
        env.close()


def test_envs_leased_from_a_pool(no_leak):
    pool = envforge.make_pool(SLUG, size=2, backend="process", hash_seed=MARK, **FAST)
    scores = []
    try:
        pool.wait_warm(timeout=30)
        def worker(seed):
            env = envforge.make(SLUG, pool=pool)
            try:
                scores.extend(play(env, seed + k)[0] for k in range(3))
            finally:
                env.close()  # the sandbox goes back to the pool
        threads = [threading.Thread(target=worker, args=(10 * w,)) for w in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert scores == [1.0] * 6
        worker(100)  # a third env gets a sandbox back from the pool
        assert pool.replaced == 0 and pool.started == 2
    finally:
        pool.close()


def test_make_with_a_pool_runs_only_the_pools_env_under_its_limits(tmp_path):
    """With pool=, make neither repeats the gate nor takes limits; another env is refused."""
    from types import SimpleNamespace

    def acquire():
        raise LookupError("leased")  # stop there: make got as far as the pool

    env_file = write_env(tmp_path / "mine", good_source()) / "env.py"
    pool = SimpleNamespace(source=env_file.read_text(), limits=None, backend=None, acquire=acquire)
    other = write_env(tmp_path / "other", good_source() + "\n# another env\n")
    with pytest.raises(UsageError, match=r"other/env.py is not the env this pool runs"):
        envforge.make(other, pool=pool)
    with pytest.raises(UsageError, match=r"^limits \(call_timeout_s, memory_mb\) are the pool's"):
        envforge.make(env_file, pool=pool, **FAST)
    (env_file.parent / "report.json").write_text(json.dumps({"verdict": "reject", "findings": []}))
    with pytest.raises(InputError, match="rejected by the gate"):
        envforge.make(env_file, backend="process")
    with pytest.raises(LookupError, match="leased"):  # the pool's own checks ran when it was made
        envforge.make(env_file, pool=pool)


def test_limits_out_of_range_are_usage_errors():
    with pytest.raises(UsageError, match="^Limits.memory_mb must be at least 64, got 10$"):
        envforge.make(SLUG, memory_mb=10)
    with pytest.raises(UsageError, match="^Limits.call_timeout_s must be greater than 0, got 0$"):
        envforge.make_pool(SLUG, call_timeout_s=0)


def test_docker_env_passes_the_checker(no_leak):
    from gymnasium.utils.env_checker import check_env
    from tests import test_docker
    if test_docker.REASON is not None:
        pytest.skip(f"no Docker engine: {test_docker.REASON}")
    test_docker.ensure_image()
    env = envforge.make(SLUG, backend=test_docker.backend(), hash_seed=MARK, **FAST)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the no-spec render note
            check_env(env)
        assert play(env, 9)[0] == 1.0
    finally:
        env.close()
    assert test_docker.containers() == []


def test_the_unsafe_inprocess_backend_warns_and_is_never_a_default():
    from sandbox.base import get_backend
    assert get_backend().name != "unsafe-inprocess"
    with pytest.warns(RuntimeWarning, match="runs env code INSIDE THIS PROCESS with no isolation"):
        env = envforge.make(SLUG, backend="unsafe-inprocess")
    assert env.unwrapped._sandbox.backend == "unsafe-inprocess"
    assert play(env, 1)[0] == 1.0
    env.close()


def test_backends_by_name():
    from sandbox.base import BACKENDS, get_backend
    from sandbox.process import ProcessBackend
    assert BACKENDS == ("auto", "process", "docker", "unsafe-inprocess")
    assert get_backend("process").name == "process" and get_backend("docker").name == "docker"
    mine = ProcessBackend(isolation="none")
    assert get_backend(mine) is mine
    with pytest.raises(UsageError, match="^unknown sandbox backend 'vm'; choose auto, process, "
                                         "docker, unsafe-inprocess$"):
        get_backend("vm")


def steps_alone(seed: int, actions: list, where=SLUG) -> list:
    """What env.step returns for ``actions`` on a fresh episode of ``seed``, one env alone."""
    env = envforge.make(where, backend="process", hash_seed=MARK, **FAST)
    try:
        env.reset(seed=seed)
        return [env.step(action) for action in actions]
    finally:
        env.close()


def test_step_all_steps_a_pools_envs_together_as_step_would(no_leak):
    """step_all gives each env what env.step gives it (the same episodes as one at a time), in
    one call_all of the pool; a refused action or an env outside its episode gets its own error
    and the others step on."""
    pool = envforge.make_pool(SLUG, size=4, backend="process", hash_seed=MARK, **FAST)
    envs = [envforge.make(SLUG, pool=pool) for _ in range(4)]
    try:
        batches = []
        call_all = pool.call_all
        pool.call_all = lambda calls: batches.append(len(calls)) or call_all(calls)
        plans = [env.unwrapped.solve(seed) for env, seed in zip(envs, (1, 2, 3, 4))]
        for env, seed in zip(envs[:3], (1, 2, 3)):
            env.reset(seed=seed)  # envs[3] is not in an episode
        wrong = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_order",
                                                         "arguments": '{"order_id": "nope"}'}}]}
        out = envforge.step_all(envs, [plans[0][0], wrong, "hello", plans[3][0]])
        assert batches == [2]  # the two steps that could go, in one call
        assert isinstance(out[2], ValueError) and "must be an assistant message" in str(out[2])
        assert isinstance(out[3], UsageError) and "before reset" in str(out[3])
        later = envforge.step_all(envs[:2], [plans[0][1], plans[1][0]])
        assert batches == [2, 2]
        # each env got what env.step gives on its own episode
        assert [out[0], later[0]] == steps_alone(1, plans[0][:2])
        assert [out[1], later[1]] == steps_alone(2, [wrong, plans[1][0]])
        assert out[0] != out[1]
    finally:
        for env in envs:
            env.close()
        pool.close()


def test_step_all_ends_only_the_episode_whose_sandbox_hung(tmp_path, no_leak):
    """A sandbox that hangs mid step_all: that env gets SandboxTimeout (the sandbox killed) and
    its next reset a fresh sandbox; the other env's step is answered as env.step would."""
    hang = next(v.source for v in variants() if v.name == "hang")
    env_dir = write_env(tmp_path / "hang", hang)
    pool = envforge.make_pool(env_dir, size=2, backend="process", hash_seed=MARK, **FAST)
    envs = [envforge.make(env_dir, pool=pool) for _ in range(2)]
    try:
        plan = envs[1].unwrapped.solve(2)
        for env, seed in zip(envs, (1, 2)):
            env.reset(seed=seed)
        first = envs[0].unwrapped._sandbox
        out = envforge.step_all(envs, [{"role": "assistant", "content": "anything else?"}, plan[0]])
        assert isinstance(out[0], SandboxTimeout) and "step did not answer within 1 s" in str(out[0])
        assert out[1] == steps_alone(2, plan[:1], where=env_dir)[0]
        assert first.closed and envs[0].unwrapped._sandbox is None
        with pytest.raises(UsageError):
            envs[0].step({"role": "assistant", "content": "hi"})
        assert play(envs[0], 4)[0] == 1.0  # a fresh sandbox from the pool
    finally:
        for env in envs:
            env.close()
        pool.close()


def test_an_interrupt_in_step_all_ends_every_episode_it_stepped(no_leak):
    """Ctrl-C mid step_all: some replies were read, some sandboxes killed; no env may go on as
    if its episode were in step (a killed one would otherwise lease a fresh sandbox and step an
    instance never reset). Wrapped envs are stepped unwrapped."""
    import gymnasium
    pool = envforge.make_pool(SLUG, size=3, backend="process", hash_seed=MARK, **FAST)
    envs = [envforge.make(SLUG, pool=pool) for _ in range(3)]
    try:
        plans = [env.unwrapped.solve(seed) for env, seed in zip(envs, (1, 2, 3))]
        for env, seed in zip(envs, (1, 2, 3)):
            env.reset(seed=seed)

        def interrupted(*a):
            raise KeyboardInterrupt
        envs[1].unwrapped._sandbox.transport.recv_line = interrupted
        with pytest.raises(KeyboardInterrupt):
            envforge.step_all([gymnasium.Wrapper(envs[0]), envs[1], envs[2]],
                              [plan[0] for plan in plans])
        for env in envs:
            with pytest.raises(UsageError, match="call reset"):
                env.step(plans[0][0])
        assert [play(env, seed)[0] for env, seed in zip(envs, (4, 5, 6))] == [1.0] * 3
    finally:
        for env in envs:
            env.close()
        pool.close()


def test_step_all_refuses_a_reward_that_is_not_a_finite_number(no_leak):
    """A reward too large for a float (or not finite) is the env breaking the contract: that
    env's step is an EnvCallError and its episode ends; the lane's other steps are answered."""
    from envforge.gym import SandboxEnv
    from sandbox.pool import SandboxPool
    from tests.test_pool import BY_ACTION
    pool = SandboxPool(BY_ACTION, size=2, backend="process", hash_seed=MARK)
    envs = [SandboxEnv(BY_ACTION, pool=pool) for _ in range(2)]
    try:
        for env in envs:
            env.reset(seed=1)
        bad, good = envforge.step_all(envs, [{"role": "assistant", "content": "huge reward"},
                                             {"role": "assistant", "content": "hi"}])
        assert isinstance(bad, EnvCallError) and "want a finite float" in str(bad)
        assert good[0]["messages"][0]["content"] == "echo hi"
        with pytest.raises(UsageError):
            envs[0].step({"role": "assistant", "content": "hi"})
    finally:
        for env in envs:
            env.close()
        pool.close()


def test_an_observation_that_breaks_the_contract_ends_the_episode_not_the_caller(tmp_path, no_leak):
    """An env that answers one kind of action with something that is not an observation (or
    info that is not a dict) gets an EnvCallError, which rollouts catch, not a value the trainer
    crashes on; the sandbox lives on (its code ran as written)."""
    odd = override("""
        def reset(self, seed):
            obs, info = _Base.reset(self, seed)
            if seed == 2:
                obs["messages"].append({"role": "narrator", "content": "hi"})
            if seed == 3:
                info = ["not", "a", "dict"]
            return obs, info

        def step(self, action):
            obs, reward, terminated, truncated, info = _Base.step(self, action)
            if action.get("content") == "odd":
                return ["not an observation"], reward, terminated, truncated, info
            return obs, reward, terminated, truncated, info
    """)
    env = envforge.make(write_env(tmp_path / "odd", odd), backend="process", hash_seed=MARK,
                        unsafe_skip_gate=True)
    try:
        assert play(env, 1)[0] == 1.0  # what the probes would see
        env.reset(seed=1)
        sandbox = env.unwrapped._sandbox
        with pytest.raises(EnvCallError, match=r"^step returned an observation that is not "
                                               r"\{'messages': \[\.\.\.\]\} but a list$"):
            env.step({"role": "assistant", "content": "odd"})
        with pytest.raises(UsageError):  # the episode is over
            env.step({"role": "assistant", "content": "hi"})
        with pytest.raises(EnvCallError, match="reset returned an observation with a message that "
                                               "is not one .*'narrator'"):
            env.reset(seed=2)
        with pytest.raises(EnvCallError, match="reset returned info that is not a dict but a list"):
            env.reset(seed=3)
        assert env.unwrapped._sandbox is sandbox and play(env, 4)[0] == 1.0
    finally:
        env.close()


def test_the_example_env_takes_no_pasted_record_for_a_refusal(no_leak):
    """The shipped env credits a decline that names the failed check; a loan record pasted as it
    came holds "overdue" too, and the gate's "records said back" probe found that on some draws
    (a CI run rejected the shipped env once). The reads of the reference, then their results said
    back as the reply: no refusal, no score, the episode goes on."""
    env = envforge.make(SLUG, backend="process", hash_seed=MARK, **FAST)
    try:
        seeds = [s for s in range(60) if "is overdue" in str(env.unwrapped.solve(s)[-1].get("content"))]
        assert len(seeds) >= 3, "the example env declines an overdue loan on a few of 60 seeds"
        for seed in seeds[:3]:
            plan = env.unwrapped.solve(seed)
            env.reset(seed=seed)
            said = []
            for action in plan[:-1]:
                obs, reward, terminated, truncated, _ = env.step(action)
                assert not terminated and reward == 0.0
                said += [m["content"] for m in obs["messages"] if m["role"] == "tool"]
            assert any('"overdue"' in s for s in said), said
            obs, reward, terminated, _, _ = env.step({"role": "assistant", "content": "\n".join(said)})
            assert (reward, terminated) == (0.0, False), (seed, reward, obs)
            # the reference's own decline still earns the full score
            obs, reward, terminated, _, _ = env.step(plan[-1])
            assert (reward, terminated) == (1.0, True), (seed, reward, obs)
    finally:
        env.close()
