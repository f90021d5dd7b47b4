"""Tenants, API-key hashing and authentication."""

import hashlib
import re

import pytest
import yaml

from steersman.config.admission import AdmissionSettings
from steersman.control.tenants import (
    AuthError, TenantConfig, TenantConfigError, TenantDirectory, generate_key, hash_key, load_tenants,
)
from steersman.policy.request import PriorityClass

KEY_A, KEY_F = "sk-steersman-acme-test-key", "sk-steersman-free-test-key"


def _data(**extra):
    data = {
        "tenants": {
            "acme": {"priority": "critical", "requests_per_minute": 600, "tokens_per_minute": 200000, "budget_usd": 50, "weight": 2},
            "free": {"priority": "sheddable", "requests_per_minute": 10},
        },
        "api_keys": [{"sha256": hash_key(KEY_A), "tenant": "acme"}, {"sha256": hash_key(KEY_F), "tenant": "free"}],
    }
    data.update(extra)
    return data


def test_the_documented_example_parses():
    doc = yaml.safe_load(
        """
tenants:
  acme: {priority: critical, requests_per_minute: 600, tokens_per_minute: 200000, budget_usd: 50, weight: 2}
  free: {priority: sheddable, requests_per_minute: 10}
api_keys:
  - {sha256: "%s", tenant: acme}
"""
        % hash_key(KEY_A)
    )
    d = TenantDirectory.from_data(doc)
    assert not d.open and d.key_count == 1
    assert d.get("acme") == TenantConfig("acme", PriorityClass.CRITICAL, 600.0, 200000.0, 50.0, 2.0)
    assert d.get("free") == TenantConfig("free", PriorityClass.SHEDDABLE, 10.0, None, None, 1.0)


def test_hash_is_sha256_hex_of_the_full_key():
    assert hash_key("sk-steersman-x") == hashlib.sha256(b"sk-steersman-x").hexdigest()


def test_generate_key_is_prefixed_random_and_hashed():
    key, digest = generate_key()
    assert re.fullmatch(r"sk-steersman-[A-Za-z0-9_-]{43}", key)  # 32 bytes urlsafe base64, unpadded
    assert digest == hash_key(key) and len(digest) == 64
    assert generate_key()[0] != key


def test_authenticate_known_keys_and_bearer_scheme_case():
    d = TenantDirectory.from_data(_data())
    assert d.authenticate(f"Bearer {KEY_A}").name == "acme"
    assert d.authenticate(f"bearer   {KEY_F}").name == "free"


@pytest.mark.parametrize(
    "header, reason",
    [
        (None, "missing"),
        ("", "missing"),
        ("   ", "missing"),
        (KEY_A, "malformed"),  # no scheme
        (f"Basic {KEY_A}", "malformed"),
        ("Bearer", "malformed"),
        (f"Bearer {KEY_A} extra", "malformed"),
        ("Bearer sk-steersman-wrong", "unknown"),
        (f"Bearer {KEY_A.upper()}", "unknown"),
    ],
)
def test_authentication_errors_are_distinct(header, reason):
    got = TenantDirectory.from_data(_data()).authenticate(header)
    assert isinstance(got, AuthError) and got.reason == reason and got.status == 401


def test_auth_error_messages_differ():
    d = TenantDirectory.from_data(_data())
    assert len({d.authenticate(h).message for h in (None, "x", "Bearer nope")}) == 3


def test_open_mode_without_keys_every_request_is_the_default_tenant():
    d = TenantDirectory.from_data({"tenants": {"free": {"requests_per_minute": 5}}})
    assert d.open and d.key_count == 0
    for header in (None, "Bearer unused", "garbage"):
        t = d.authenticate(header)
        assert t == TenantConfig("default", PriorityClass.STANDARD)
    assert d.get("default") is d.open_tenant
    assert TenantDirectory.from_data(None).open


def test_open_mode_uses_a_configured_default_tenant():
    d = TenantDirectory.from_data({"tenants": {"default": {"priority": "batch", "requests_per_minute": 100}}})
    assert d.authenticate(None) == TenantConfig("default", PriorityClass.BATCH, 100.0)


def test_default_tenant_is_not_implicit_when_keys_exist():
    with pytest.raises(KeyError, match="default"):
        TenantDirectory.from_data(_data()).get("default")


def test_uppercase_digest_in_config_is_accepted():
    data = _data(api_keys=[{"sha256": hash_key(KEY_A).upper(), "tenant": "acme"}])
    assert TenantDirectory.from_data(data).authenticate(f"Bearer {KEY_A}").name == "acme"


def test_default_priority_comes_from_settings():
    d = TenantDirectory.from_data({"tenants": {"x": None}}, settings=AdmissionSettings(default_priority="batch"))
    assert d.get("x").priority is PriorityClass.BATCH


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["api_keys"].append({"sha256": "abc", "tenant": "acme"}), r"api_keys\[2\]\.sha256 must be 64 hex characters"),
        (lambda d: d["api_keys"].append({"sha256": "g" * 64, "tenant": "acme"}), r"api_keys\[2\]\.sha256 must be 64 hex"),
        (lambda d: d["api_keys"].append({"sha256": KEY_A, "tenant": "acme"}), r"api_keys\[2\]\.sha256"),
        (lambda d: d["api_keys"].append({"sha256": "a" * 64, "tenant": "ghost"}), r"api_keys\[2\]\.tenant 'ghost' is not a configured tenant"),
        (lambda d: d["api_keys"].append({"sha256": hash_key(KEY_A), "tenant": "free"}), r"api_keys\[2\]\.sha256 duplicates api_keys\[0\]"),
        (lambda d: d["api_keys"].append({"sha256": "a" * 64, "tenant": "acme", "note": 1}), r"api_keys\[2\]: unknown field"),
        (lambda d: d["api_keys"].append("a" * 64), r"api_keys\[2\] must be a mapping"),
        (lambda d: d.update(api_keys={"a": 1}), r"api_keys must be a list"),
        (lambda d: d["tenants"]["free"].update(priority="urgent"), r"tenants\.free\.priority: unknown priority class 'urgent'"),
        (lambda d: d["tenants"]["free"].update(requests_per_minute=0), r"tenants\.free\.requests_per_minute must be > 0"),
        (lambda d: d["tenants"]["free"].update(tokens_per_minute="lots"), r"tenants\.free\.tokens_per_minute must be a finite number"),
        (lambda d: d["tenants"]["free"].update(budget_usd=-1), r"tenants\.free\.budget_usd must be >= 0"),
        (lambda d: d["tenants"]["free"].update(weight=True), r"tenants\.free\.weight must be a finite number"),
        (lambda d: d["tenants"]["free"].update(weight=float("inf")), r"tenants\.free\.weight must be a finite number"),
        (lambda d: d["tenants"]["free"].update(rpm=1), r"tenants\.free: unknown field\(s\) \['rpm'\]"),
        (lambda d: d["tenants"].update({123: {}}), r"tenant name 123 must be a string"),
        (lambda d: d["tenants"].update({"has space": {}}), r"tenant name 'has space'"),
        (lambda d: d.update(tenants=["acme"]), r"tenants must be a mapping"),
        (lambda d: d.update(api_key=[]), r"unknown key\(s\) \['api_key'\]"),
    ],
)
def test_validation_errors_name_the_field(mutate, message):
    data = _data()
    mutate(data)
    with pytest.raises(TenantConfigError, match=message):
        TenantDirectory.from_data(data)


def test_load_tenants_from_a_file(tmp_path):
    p = tmp_path / "tenants.yaml"
    p.write_text(yaml.safe_dump(_data()))
    assert load_tenants(p).authenticate(f"Bearer {KEY_F}").name == "free"
    p.write_text("tenants: [unclosed")
    with pytest.raises(TenantConfigError, match="invalid YAML"):
        load_tenants(p)
    with pytest.raises(TenantConfigError, match="cannot read"):
        load_tenants(tmp_path / "missing.yaml")


def test_repr_shows_no_digests():
    r = repr(TenantDirectory.from_data(_data()))
    assert hash_key(KEY_A) not in r and hash_key(KEY_A)[:8] not in r and "keys=2" in r


def test_a_number_no_float_holds_or_a_weight_whose_inverse_overflows_is_a_config_error(tmp_path):
    """YAML reads any run of digits as an int: one past a float's range raised OverflowError, not the config error
    naming the field; a subnormal weight passed and made the fair queue's 1 / weight infinite."""
    p = tmp_path / "t.yaml"
    p.write_text("tenants:\n  a: {budget_usd: " + "9" * 400 + "}\n")
    with pytest.raises(TenantConfigError, match=r"tenants\.a\.budget_usd must be a finite number"):
        load_tenants(p)
    with pytest.raises(TenantConfigError, match=r"tenants\.a\.weight must be a finite number"):
        TenantDirectory.from_data({"tenants": {"a": {"weight": 10**5000}}})  # (more digits than int -> str allows)
    for tiny in (1e-320, 1e-12):
        with pytest.raises(TenantConfigError, match=r"tenants\.a\.weight must be >= 1e-09"):
            TenantDirectory.from_data({"tenants": {"a": {"weight": tiny}}})
    assert TenantDirectory.from_data({"tenants": {"a": {"weight": 1e-9, "budget_usd": 10**300}}}).get("a").weight == 1e-9
