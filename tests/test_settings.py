"""Settings: one dataclass per stage, bounds declared on the fields and checked on construction."""
from dataclasses import dataclass

import pytest

from envforge.contract import Limits
from envforge.errors import ConfigError, UsageError
from envforge.gate.config import GateSettings
from envforge.settings import Settings, bounds_problem, default_of, field_of, flag_of, named, setting
from trainers.grpo_config import GRPOConfig


@dataclass
class Toy(Settings):
    count: int = setting(3, "How many.", low=1, high=10)
    share: float = setting(0.5, "A share.", above=0, high=1)
    mode: str = setting("a", "Which mode.", choices=("a", "b"))
    cap: int | None = setting(None, "None: no cap.", low=1)

    def check(self):
        if self.mode == "b" and self.cap is None:
            self.fail("cap", "must be set when mode is b")


@pytest.mark.parametrize("kw, message", [
    ({"count": 0}, "Toy.count must be from 1 to 10, got 0"),
    ({"count": "3"}, "Toy.count must be a number, got '3'"),
    ({"count": True}, "Toy.count must be a number, got True"),
    ({"share": 0}, "Toy.share must be greater than 0, got 0"),
    ({"share": float("nan")}, "Toy.share must be a finite number, got nan"),
    ({"mode": "c"}, "Toy.mode must be one of a, b, got 'c'"),
    ({"cap": 0}, "Toy.cap must be at least 1, got 0"),
    ({"mode": "b"}, "Toy.cap must be set when mode is b"),
])
def test_a_bad_setting_names_the_field(kw, message):
    with pytest.raises(ConfigError) as e:
        Toy(**kw)
    assert str(e.value) == message
    assert (e.value.owner, e.value.field) == ("Toy", message.split()[0].split(".")[1])
    assert isinstance(e.value, UsageError) and isinstance(e.value, ValueError) and e.value.exit_code == 2


def test_good_settings_and_their_metadata():
    t = Toy(count=10, share=1, cap=4)
    assert t.to_dict() == {"count": 10, "share": 1, "mode": "a", "cap": 4}
    assert field_of(Toy, "share").metadata["help"] == "A share."
    assert default_of(GateSettings, "limits") == Limits()
    with pytest.raises(AttributeError, match="Toy has no setting 'nope'"):
        field_of(Toy, "nope")
    assert bounds_problem({"low": 1, "optional": True}, None) is None


def test_a_setting_declares_its_flag_where_the_flag_is_not_its_name():
    """The command line's flag and a message's name come from the field: ``--name-with-dashes``,
    or the flag it declares (then a message names both, for Python callers and CLI users)."""
    assert (flag_of(GRPOConfig, "learning_rate"), flag_of(GRPOConfig, "max_new_tokens")) == ("--lr", "--max-new-tokens")
    assert named(GRPOConfig, "learning_rate") == "learning_rate (--lr)"
    assert named(GRPOConfig, "max_new_tokens") == "max_new_tokens"


def test_stage_configs_check_their_bounds():
    with pytest.raises(ConfigError, match=r"^GateSettings.seeds must be from 2 to 512, got 1$"):
        GateSettings(seeds=1)
    with pytest.raises(ConfigError, match=r"^Limits.memory_mb must be at least 64, got 10$"):
        Limits(memory_mb=10)
    with pytest.raises(ConfigError, match=r"^GRPOConfig.group_size must be at least 2, got 1$"):
        GRPOConfig(group_size=1)
    with pytest.raises(ConfigError, match=r"^GRPOConfig.num_groups must be an integer, got 2.5$"):
        GRPOConfig(num_groups=2.5)


def test_lora_alpha_defaults_to_twice_the_rank_in_the_config_itself():
    assert GRPOConfig(lora_rank=8).lora_alpha == 16
    assert GRPOConfig().lora_alpha == 64
    assert GRPOConfig(lora_rank=8, lora_alpha=8).lora_alpha == 8


def test_old_import_paths_still_work():
    from envforge.gate.dynamic import GateSettings as old
    assert old is GateSettings


@pytest.mark.parametrize("device", ["cudax", "cuda:abc", "cuda:-1", "gpu", "", "CPU"])
def test_a_device_name_torch_would_refuse_is_a_config_error(device):
    """The trainer's and the demo's device: a name torch would fail on later (mid-run, with its
    own traceback) is refused when the config is built."""
    with pytest.raises(ConfigError, match="must be 'cpu', 'cuda' or 'cuda:N'"):
        GRPOConfig(device=device)


def test_a_cuda_device_torch_does_not_see_is_a_config_error():
    import torch
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ConfigError, match="no CUDA device" if not count else f"torch sees {count} GPU"):
        GRPOConfig(device=f"cuda:{count}")
    assert GRPOConfig(device="cpu").device == "cpu"
