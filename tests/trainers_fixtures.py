"""Helpers for the trainer tests: a tiny local model (made with trainers.tiny, saved with
save_pretrained, loaded back with from_pretrained) and a trivially learnable env."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the train extra is not installed: "
                            "pip install -c constraints.txt -e '.[train]'")
pytest.importorskip("peft", reason="the train extra is not installed")
pytest.importorskip("transformers", reason="the train extra is not installed")

from tests.envfactory import write_env  # noqa: E402

torch.set_num_threads(1)

#: Two user turns, each rewarded for a short reply (partial credit by length): a random tiny
#: model learns it in a few dozen GRPO iterations (it must raise the end-of-turn token early).
BREVITY_ENV = textwrap.dedent('''
    """Capability: brevity.

    Why it transfers: a test env; two user turns, each rewarded for a short reply.
    """
    import json

    CAPABILITY = "brevity"


    class Env:
        tools = []
        max_turns = 2

        def reset(self, seed):
            self.turn = 0
            return {"messages": [{"role": "system", "content": "Answer briefly."},
                                 {"role": "user", "content": "Say ok. " + str(seed % 7)}]}, {}

        def step(self, action):
            self.turn += 1
            text = action.get("content") or ""
            reward = 0.5 * max(0.0, 1.0 - len(text) / 24.0)
            done = self.turn >= 2
            obs = {"messages": [] if done else [{"role": "user", "content": "Again."}]}
            return obs, round(reward, 4), done, False, {}

        def solve(self, seed):
            return [{"role": "assistant", "content": ""}, {"role": "assistant", "content": ""}]
''').lstrip()

_MODELS: dict = {}


def tiny_model_dir(tmp_root: Path, family: str = "hermes", hidden: int = 32) -> Path:
    """A saved tiny model of ``family`` (made once per session and root)."""
    from trainers.tiny import save_tiny
    key = (str(tmp_root), family, hidden)
    if key not in _MODELS:
        _MODELS[key] = save_tiny(tmp_root / f"tiny-{family}-{hidden}", family, hidden=hidden)
    return _MODELS[key]


def brevity_env(folder: Path) -> Path:
    return write_env(folder, BREVITY_ENV, target=None)


@pytest.fixture(scope="session")
def model_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def hermes_dir(model_root) -> Path:
    return tiny_model_dir(model_root, "hermes")


@pytest.fixture(scope="session")
def llama_dir(model_root) -> Path:
    return tiny_model_dir(model_root, "llama3")


@pytest.fixture(scope="session")
def env_dir(tmp_path_factory) -> Path:
    return brevity_env(tmp_path_factory.mktemp("envs") / "brevity")
