"""``steersman keys create``."""

import re

import typer
import yaml
from typer.testing import CliRunner

from steersman.cli import keys_cmd
from steersman.control.tenants import TenantDirectory, hash_key


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        pass

    keys_cmd.register(app)
    return app


def test_create_prints_the_key_once_the_yaml_line_and_a_warning():
    r = CliRunner().invoke(_app(), ["keys", "create", "--tenant", "acme"])
    assert r.exit_code == 0, r.output
    keys = re.findall(r"sk-steersman-[A-Za-z0-9_-]+", r.stdout)
    assert len(keys) == 1
    line = next(ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("- {sha256"))
    entry = yaml.safe_load(line)[0]
    assert entry == {"sha256": hash_key(keys[0]), "tenant": "acme"}
    assert "not stored anywhere" in r.stderr
    # the pasted line works as configuration
    d = TenantDirectory.from_data({"tenants": {"acme": {}}, "api_keys": [entry]})
    assert d.authenticate(f"Bearer {keys[0]}").name == "acme"


def test_each_call_makes_a_new_key():
    out = [CliRunner().invoke(_app(), ["keys", "create", "--tenant", "t"]).stdout for _ in range(2)]
    assert out[0] != out[1]


def test_tenant_names_yaml_would_misread_are_quoted():
    from steersman.fleet.config import load_yaml

    for name in ("123", "1e3"):  # (1e3: a number to the fleet file's YAML 1.2 reading, a string to YAML 1.1)
        r = CliRunner().invoke(_app(), ["keys", "create", "--tenant", name])
        line = next(ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("- {sha256"))
        assert load_yaml(line)[0]["tenant"] == name


def test_bad_or_missing_tenant_is_a_usage_error():
    r = CliRunner().invoke(_app(), ["keys", "create", "--tenant", "a b"])
    assert r.exit_code == 2 and "tenant name 'a b'" in r.stderr and "sk-steersman-" not in r.output
    r = CliRunner().invoke(_app(), ["keys", "create"])
    assert r.exit_code == 2 and "--tenant" in r.output
