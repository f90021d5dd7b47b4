"""The engine adapter extension point: what an adapter must have (steersman.engines.base.EngineAdapter)."""


def test_the_adapter_protocol_still_asks_for_every_method():
    """(A helper function once landed between the Protocol's methods, leaving ``health`` and ``close`` out of it.)"""
    from steersman.engines import OpenAIHttpAdapter
    from steersman.engines.base import EngineAdapter

    for name in ("send", "scrape", "list_models", "health", "close"):
        assert callable(getattr(EngineAdapter, name, None)), name

    class NoClose:
        kind = "x"
        shares_prefill_in_flight = True
        idle_probe = True

        async def send(self, *a, **k): ...
        async def scrape(self, *a): ...
        async def list_models(self, *a): ...
        async def health(self, *a): ...

    assert isinstance(OpenAIHttpAdapter("vllm"), EngineAdapter) and not isinstance(NoClose(), EngineAdapter)
