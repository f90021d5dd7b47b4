"""A tenants file is read as the fleet file is (steersman.config._yaml.load_yaml): a key given twice is an error
naming it (yaml.safe_load kept the last: a second `acme:` silently replaced the first tenant's limits), numbers are
YAML 1.2's (`budget_usd: 1e3` a number, not a string refused; a tenant named `1e3` a number, refused with the hint to
quote it, as `steersman keys create` quotes it)."""

from __future__ import annotations

import pytest

from steersman.control.tenants import TenantConfigError, hash_key, load_tenants

_KEY = hash_key("sk-steersman-test")


def _file(tmp_path, text: str):
    p = tmp_path / "tenants.yaml"
    p.write_text(text)
    return p


def test_the_fleet_file_and_a_tenants_file_share_one_loader():
    from steersman.config._yaml import load_yaml
    from steersman.fleet._config_checks import load_yaml as fleet_load_yaml

    assert fleet_load_yaml is load_yaml


def test_numbers_in_a_tenants_file_are_read_as_yaml_1_2_reads_them(tmp_path):
    p = _file(tmp_path, "tenants:\n  acme: {budget_usd: 1e3, requests_per_minute: 6e2, tokens_per_minute: 010, "
                        "weight: 2.5e0}\n")
    t = load_tenants(p).get("acme")
    assert (t.budget_usd, t.requests_per_minute, t.tokens_per_minute, t.weight) == (1000.0, 600.0, 10.0, 2.5)


def test_a_tenant_given_twice_is_refused_naming_it_and_the_file(tmp_path):
    p = _file(tmp_path, "tenants:\n  acme: {priority: critical}\n  free: {}\n  acme: {priority: sheddable}\n")
    with pytest.raises(TenantConfigError, match=r"tenants\.yaml: invalid YAML: .*duplicate key 'acme' on line 4 "
                                                r"\(first given on line 2\)"):
        load_tenants(p)
    p = _file(tmp_path, f"tenants: {{acme: {{}}}}\napi_keys:\n  - {{sha256: '{_KEY}', tenant: acme, tenant: free}}\n")
    with pytest.raises(TenantConfigError, match=r"tenants\.yaml: invalid YAML: .*duplicate key 'tenant' on line 3"):
        load_tenants(p)
    p = _file(tmp_path, "tenants: {acme: {}}\napi_keys: []\ntenants: {free: {}}\n")
    with pytest.raises(TenantConfigError, match=r"tenants\.yaml: invalid YAML: .*duplicate key 'tenants' on line 3"):
        load_tenants(p)


def test_a_tenant_name_yaml_reads_as_a_boolean_or_a_number_is_refused_and_quoted_is_a_name(tmp_path):
    """`on` / `yes` are booleans to the fleet file's loader too (its booleans are YAML 1.1's), `1e3` and `0x1F`
    numbers to it: as keys they are refused naming the name and saying to quote it; quoted they are the name."""
    for name in ("on", "yes", "1e3", "0x1F", "0o17"):
        p = _file(tmp_path, f"tenants:\n  {name}: {{priority: critical}}\n")
        with pytest.raises(TenantConfigError, match=r"tenants\.yaml: tenant name .* \(.*quote names YAML reads as"):
            load_tenants(p)
        p = _file(tmp_path, f"tenants:\n  '{name}': {{priority: critical}}\napi_keys:\n"
                            f"  - {{sha256: '{_KEY}', tenant: '{name}'}}\n")
        d = load_tenants(p)
        assert d.authenticate("Bearer sk-steersman-test").name == name
        assert list(d.tenants) == [name]


def test_a_tenants_file_that_is_not_utf8_is_named(tmp_path):
    p = tmp_path / "tenants.yaml"
    p.write_bytes(b"\xff\xfe" + "tenants: {}\n".encode("utf-16-le"))
    with pytest.raises(TenantConfigError, match=r"cannot read .*tenants\.yaml: not UTF-8 text"):
        load_tenants(p)
