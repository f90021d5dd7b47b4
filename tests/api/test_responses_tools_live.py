"""``/v1/responses`` tools over real HTTP with the official client: a function tool with an empty name is refused
in the Responses API's own terms (it used to pass the translation and be refused by the chat check behind it,
whose advice, the chat tool's shape, is refused on /v1/responses too); the OpenAPI document says so."""

from __future__ import annotations

import httpx
import openai
import pytest

from steersman.enginesim.app import SimServerConfig
from steersman.testing import LiveFleet

MODEL = "llama-3.1-8b"


def test_an_empty_tool_name_is_a_400_naming_tools_i_name_and_the_schema_requires_a_name():
    with LiveFleet(sims=[SimServerConfig(speedup=50.0, port=0)]) as lf, \
            openai.OpenAI(base_url=lf.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
        tools = [{"type": "function", "name": "ok"}, {"type": "function", "name": ""}]
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, input="hi", tools=tools, max_output_tokens=4)
        err = e.value.body
        assert e.value.status_code == 400 and err["param"] == "tools[1].name", err
        assert err["message"] == "'tools[1].name' must be a non-empty string." and "function" not in err["message"]
        assert client.responses.create(model=MODEL, input="hi", tools=tools[:1], max_output_tokens=4).id
        doc = httpx.get(lf.url + "/openapi.json", timeout=10).json()
        tool = doc["components"]["schemas"]["ResponsesRequest"]["properties"]["tools"]["items"]
        assert tool["properties"]["name"]["minLength"] == 1
