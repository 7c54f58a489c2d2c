"""What `import envforge` loads: the CLI and the gate must start fast and without heavy packages.
Which module may import which is the layering contract's job (tests/test_layers.py)."""
import subprocess
import sys

HEAVY = ("torch", "trl", "peft", "transformers", "docker", "ray", "openai", "matplotlib")


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

