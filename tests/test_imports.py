"""What `import envforge` loads: the CLI and the gate must start fast and without heavy packages.
Which module may import which is the layering contract's job (tests/test_layers.py)."""
import subprocess
import sys

HEAVY = ("torch", "trl", "peft", "transformers", "docker", "ray", "openai", "matplotlib", "numpy")


def _loaded(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_import_envforge_is_light():
    mods = _loaded("import envforge")
    assert not [m for m in HEAVY if m in mods]


def test_cli_and_gate_defer_hypothesis_jsonschema_rich():
    mods = _loaded("import envforge.cli, envforge.gate, sandbox.base")
    assert not [m for m in HEAVY + ("hypothesis", "jsonschema", "rich") if m in mods]



def test_the_cli_loads_the_stages_configs_not_the_stages():
    """`envforge --help` builds its options from the config modules; a stage's own code (the
    synthesizers, the labellers, the LLM client) loads when its command runs."""
    mods = _loaded("import envforge.cli")
    assert {"envforge.synth.config", "envforge.identify.config", "trainers.grpo_config"} <= mods
    assert not [m for m in ("envforge.synth.synthesizer", "envforge.synth.templates",
                            "envforge.synth.families", "envforge.identify.identification",
                            "envforge.identify.rules", "envforge.identify.llm", "envforge.llm",
                            "sandbox.docker") if m in mods]


def test_the_lazy_packages_give_their_api_and_refuse_unknown_names():
    import pytest

    import envforge.identify as identify
    import envforge.synth as synth
    from envforge.identify.identification import identify as identify_fn
    from envforge.synth.synthesizer import synthesize
    assert synth.synthesize is synthesize and identify.identify is identify_fn
    for package in (synth, identify):
        assert set(package.__all__) <= set(dir(package))
        assert all(getattr(package, name) is not None for name in package.__all__)
        with pytest.raises(AttributeError, match="no_such_name"):
            package.no_such_name
