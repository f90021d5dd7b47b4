import pytest



@pytest.fixture
def openai_client():
    from openai import OpenAI

    clients = []

    def make(url: str):
        c = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()
