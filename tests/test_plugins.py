"""Plugins from outside steersman: a fleet file's ``plugins:`` modules and the ``steersman.plugins`` entry points
register admitters, response stores and scheduling plugins that the configuration then names (the brief: one small
Protocol per extension point, registered by name, configured from YAML)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from dataclasses import replace

import openai
import pytest

from steersman import plugins
from steersman.api.response_store import RESPONSE_STORES, MemoryResponseStore, make_response_store
from steersman.config import DEFAULTS
from steersman.control.admission import ADMITTERS, DefaultAdmitter, make_admitter
from steersman.fleet.config import FleetConfigError, parse_fleet
from steersman.testing import FakeClock, LiveFleet
from steersman.testing.scripted import Script

ENDPOINT = {"url": "http://127.0.0.1:9", "models": ["m"]}

# a third party's module: an admitter refusing long prompts with its own 429, and a scorer
PLUGIN = textwrap.dedent('''
    from dataclasses import dataclass
    from steersman.control.admission import ADMITTERS, Admit, DefaultAdmitter
    from steersman.policy.framework import SCORERS

    @dataclass(frozen=True)
    class LongPrompt:
        reason: str
        status: int = 429
        code: str = "acme_prompt_quota"
        retry_after: float | None = None

    class ShortPromptsOnly(DefaultAdmitter):
        """The default admitter's books, and no prompt over 40 tokens."""
        seen = 0

        def admit(self, req, tenant, now):
            type(self).seen += 1
            if req.prompt_tokens > 40:
                return LongPrompt(f"acme admits prompts of 40 tokens at most, this one has {req.prompt_tokens}")
            return super().admit(req, tenant, now)

    ADMITTERS.register("acme-short-prompts", ShortPromptsOnly)

    class Zero:
        name = "acme-zero"

        def score(self, ctx, idx):
            import numpy as np
            return np.zeros(idx.size)

    SCORERS.register("acme-zero", lambda params=None, settings=None: Zero())
''')


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    name = f"acme_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    ADMITTERS._items.pop("acme-short-prompts", None)
    from steersman.policy.framework import SCORERS
    SCORERS._items.pop("acme-zero", None)


def test_a_fleet_files_plugins_register_before_its_names_are_read(plugin_module):
    assert "acme-short-prompts" not in ADMITTERS
    with pytest.raises(FleetConfigError, match=r"unknown admission.admitter 'acme-short-prompts'; known: default"):
        parse_fleet({"admission": {"admitter": "acme-short-prompts"}, "endpoints": [ENDPOINT]})
    cfg = parse_fleet({"plugins": [plugin_module], "admission": {"admitter": "acme-short-prompts"},
                       "scheduler": {"profiles": {"mine": {"scorers": [{"type": "acme-zero", "weight": 1}],
                                                           "picker": "max-score"}}},
                       "policy": "mine", "endpoints": [ENDPOINT]})
    assert cfg.admission.admitter == "acme-short-prompts" and cfg.policy == "mine"
    assert type(make_admitter(cfg.admission)).__name__ == "ShortPromptsOnly"


@pytest.mark.parametrize("doc, message", [
    ({"plugins": ["acme_no_such_module"]}, r"plugins: module 'acme_no_such_module' failed to import: ModuleNotFound"),
    ({"plugins": [""]}, r"plugins: each entry must be a module's dotted name, got ''"),
    ({"plugins": "acme"}, r"plugins"),
    ({"gateway": {"response_store": "acme-store"}}, r"unknown gateway.response_store 'acme-store'; known: memory, redis"),
    ({"gateway": {"response_store": "redis"}}, r"gateway.response_store 'redis' needs response_store_url"),
    ({"gateway": {"response_store": "memory", "response_store_url": "redis://127.0.0.1:6379/0"}},
     r"response_store 'memory' keeps responses in this gateway"),
])
def test_bad_plugin_settings_are_refused_naming_them(doc, message):
    with pytest.raises(FleetConfigError, match=message):
        parse_fleet({**doc, "endpoints": [ENDPOINT]})


def test_a_plugin_that_fails_on_import_is_named_with_its_error(tmp_path, monkeypatch):
    (tmp_path / "acme_broken.py").write_text("raise RuntimeError('no licence file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FleetConfigError, match=r"module 'acme_broken' failed to import: RuntimeError: no licence file"):
        parse_fleet({"plugins": ["acme_broken"], "endpoints": [ENDPOINT]})


def test_shared_limits_need_an_admitter_that_keeps_the_default_books(tmp_path, monkeypatch):
    (tmp_path / "acme_bare.py").write_text(textwrap.dedent('''
        from steersman.control.admission import ADMITTERS
        class Bare:
            def admit(self, req, tenant, now): ...
            def settle(self, ticket, *, used_tokens, cost_usd, now): ...
            def release(self, ticket, now): ...
        class NotAnAdmitter:
            def admit(self, req, tenant, now): ...
        ADMITTERS.register("acme-bare", lambda settings: Bare())
        ADMITTERS.register("acme-half", lambda settings: NotAnAdmitter())
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        base = {"plugins": ["acme_bare"], "endpoints": [ENDPOINT]}
        assert parse_fleet({**base, "admission": {"admitter": "acme-bare"}}).admission.admitter == "acme-bare"
        with pytest.raises(FleetConfigError, match=r"limits_url shares the default admitter's .* 'acme-bare' \(Bare\)"):
            parse_fleet({**base, "admission": {"admitter": "acme-bare"},
                         "gateway": {"limits_url": "redis://127.0.0.1:6379/0"}})
        with pytest.raises(FleetConfigError, match=r"admitter 'acme-half': .*does not implement Admitter .*release"):
            parse_fleet({**base, "admission": {"admitter": "acme-half"}})
    finally:
        sys.modules.pop("acme_bare", None)
        ADMITTERS._items.pop("acme-bare", None)
        ADMITTERS._items.pop("acme-half", None)


def _installed(tmp_path, monkeypatch, dist_name: str, entry: str) -> None:
    """A distribution ``dist_name`` installed (on ``sys.path``) declaring ``entry`` in group steersman.plugins."""
    dist = tmp_path / f"{dist_name.replace('-', '_')}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[steersman.plugins]\n{entry}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_loaded", set())
    monkeypatch.setattr(plugins, "_scanned", False)  # (a new distribution: scanned again)


def test_installed_packages_entry_points_are_loaded(tmp_path, monkeypatch):
    (tmp_path / "acme_ep.py").write_text(textwrap.dedent('''
        from steersman.api.response_store import RESPONSE_STORES, MemoryResponseStore
        class Counting(MemoryResponseStore):
            pass
        def register():
            RESPONSE_STORES.register("acme-counting", lambda settings, clock, count: Counting(
                settings.response_store_mib * 2**20, settings.response_store_ttl_s, clock, count))
    '''))
    _installed(tmp_path, monkeypatch, "acme-ep", "acme = acme_ep:register")
    try:
        cfg = parse_fleet({"gateway": {"response_store": "acme-counting"}, "endpoints": [ENDPOINT]})
        store = make_response_store(cfg.gateway, FakeClock())
        assert type(store).__name__ == "Counting" and isinstance(store, MemoryResponseStore)
    finally:
        sys.modules.pop("acme_ep", None)
        RESPONSE_STORES._items.pop("acme-counting", None)


def test_a_broken_entry_point_is_named(tmp_path, monkeypatch):
    _installed(tmp_path, monkeypatch, "acme-bad", "bad = acme_missing_module")
    with pytest.raises(FleetConfigError, match=r"entry point 'bad' \(acme_missing_module\) of group 'steersman.plugins'"):
        parse_fleet({"endpoints": [ENDPOINT]})


def test_the_default_names_build_what_they_did():
    assert type(make_admitter(DEFAULTS.admission)) is DefaultAdmitter
    clock = FakeClock()
    assert type(make_response_store(DEFAULTS.gateway, clock)) is MemoryResponseStore
    shared = replace(DEFAULTS.gateway, response_store_url="redis://127.0.0.1:6379/15")
    assert type(make_response_store(shared, clock)).__name__ == "RedisResponseStore"


def test_a_configured_admitter_answers_requests_live_and_in_the_twin(plugin_module, shared_dir):
    extra = {"plugins": [plugin_module], "admission": {"admitter": "acme-short-prompts"}}
    with LiveFleet(scripted=[Script(pieces=("ok",))], policy="least-request", extra=extra) as lf:
        async def run():
            async with openai.AsyncOpenAI(base_url=lf.url + "/v1", api_key="x", max_retries=0) as c:
                short = await c.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}])
                with pytest.raises(openai.RateLimitError) as long:
                    await c.chat.completions.create(model="scripted",
                                                    messages=[{"role": "user", "content": "word " * 200}])
                return short, long.value
        short, refused = asyncio.run(run())
    assert short.choices[0].message.content == "ok"
    assert refused.code == "acme_prompt_quota" and "40 tokens at most" in refused.message
    assert refused.response.headers.get("retry-after") is None  # (its refusal names no wait)

    from steersman.twin.run import Experiment
    fleet = parse_fleet({**extra, "simulated": {"replicas": [{"gpu": "H100", "model": "llama-3.1-8b", "count": 1}]}})
    spec = {"model": "llama-3.1-8b", "sources": [{"kind": "trace", "limit": 200, "slo": "standard",
                                                  "path": str(shared_dir / "traces" / "azure-llm-2023-conv.csv")}]}
    exp = Experiment(fleet, spec)
    exp.run("steersman")
    http = exp.last.arrays()["http"]
    assert (http == 429).sum() > 50 and (http == 200).sum() < 150  # (the trace's prompts: most over 40 tokens)
    assert sys.modules[plugin_module].ShortPromptsOnly.seen >= 202


def test_a_plugin_failing_half_way_is_rolled_back_and_loads_once_fixed(tmp_path, monkeypatch):
    mod = tmp_path / "acme_half.py"
    mod.write_text(textwrap.dedent('''
        from steersman.control.admission import ADMITTERS, DefaultAdmitter
        ADMITTERS.register("acme-half-way", lambda settings: DefaultAdmitter(settings))
        raise RuntimeError("licence server unreachable")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    doc = {"plugins": ["acme_half"], "admission": {"admitter": "acme-half-way"}, "endpoints": [ENDPOINT]}
    try:
        with pytest.raises(FleetConfigError, match="licence server unreachable"):
            parse_fleet(doc)
        assert "acme-half-way" not in ADMITTERS  # rolled back
        mod.write_text(mod.read_text().replace('raise RuntimeError("licence server unreachable")', ""))
        sys.modules.pop("acme_half", None)
        assert parse_fleet(doc).admission.admitter == "acme-half-way"  # (no "already registered")
    finally:
        sys.modules.pop("acme_half", None)
        ADMITTERS._items.pop("acme-half-way", None)


def test_a_plugin_calling_sys_exit_is_an_error_not_an_exit(tmp_path, monkeypatch):
    (tmp_path / "acme_exits.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(FleetConfigError, match=r"module 'acme_exits' failed to import: SystemExit: 3"):
            parse_fleet({"plugins": ["acme_exits"], "endpoints": [ENDPOINT]})
    finally:
        sys.modules.pop("acme_exits", None)


def test_a_failed_plugins_helper_module_that_loaded_keeps_its_names(tmp_path, monkeypatch):
    # acme_main imports acme_helper (registers a policy, imports fine), registers an admitter, then fails: only the
    # admitter is rolled back (acme_helper stays imported and would not register its policy again)
    (tmp_path / "acme_helper.py").write_text(textwrap.dedent('''
        from steersman.policy import POLICIES
        POLICIES.register("acme-rr", POLICIES.get("round-robin"))
    '''))
    main = tmp_path / "acme_main.py"
    main.write_text(textwrap.dedent('''
        import acme_helper
        from steersman.control.admission import ADMITTERS, DefaultAdmitter
        ADMITTERS.register("acme-main", lambda settings: DefaultAdmitter(settings))
        raise RuntimeError("not yet")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    from steersman.policy import POLICIES
    doc = {"plugins": ["acme_main"], "policy": "acme-rr", "admission": {"admitter": "acme-main"},
           "endpoints": [ENDPOINT]}
    try:
        with pytest.raises(FleetConfigError, match="not yet"):
            parse_fleet(doc)
        assert "acme-rr" in POLICIES and "acme-main" not in ADMITTERS
        main.write_text(main.read_text().replace('raise RuntimeError("not yet")', ""))
        cfg = parse_fleet(doc)
        assert cfg.policy == "acme-rr" and cfg.admission.admitter == "acme-main"
    finally:
        for m in ("acme_main", "acme_helper"):
            sys.modules.pop(m, None)
        POLICIES._items.pop("acme-rr", None)
        ADMITTERS._items.pop("acme-main", None)


def test_steersman_plugins_lists_every_extension_point_with_a_fleet_files_plugins(tmp_path):
    import os
    import subprocess

    from steersman.cli.plugins_cmd import extension_points
    from steersman.plugins import Registry

    import steersman.api.gateway  # noqa: F401  (every part of the gateway and the twin imported)
    import steersman.twin.run  # noqa: F401

    listed = {id(r) for _, _, r in extension_points()}
    made = {id(v): f"{m}.{k}" for m, mod in list(sys.modules.items()) if m.startswith("steersman")
            for k, v in list(vars(mod).items()) if isinstance(v, Registry)}
    assert len(made) >= 8 and set(made) <= listed, made  # a new extension point must be listed too

    (tmp_path / "acme_listed.py").write_text(textwrap.dedent('''
        from steersman.policy.framework import SCORERS
        SCORERS.register("acme-listed", lambda params=None, settings=None: None)
    '''))
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text('plugins: [acme_listed]\nendpoints: [{url: "http://127.0.0.1:9", models: [m]}]\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "steersman", "plugins", "--config", str(cfg)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "acme-listed" in out.stdout and "admission.admitter" in out.stdout and "memory, redis" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "steersman", "plugins", "--config", str(tmp_path / "none.yaml")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "none.yaml" in bad.stderr
