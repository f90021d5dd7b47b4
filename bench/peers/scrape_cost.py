"""CPU a llama-server spends answering the gateway's scrapes (/metrics + /slots every 50 ms), vs idle.

    .venv/bin/python bench/peers/scrape_cost.py    # needs `make llama`
"""
import asyncio, time, psutil
from steersman.fleet.processes import LlamaServerFleet
from steersman.testing import LiveFleet
f = LlamaServerFleet(1); asyncio.run(f.start())
p = psutil.Process(f.procs[0].pid)
def cpu(): t = p.cpu_times(); return t.user + t.system
try:
    time.sleep(1); c0 = cpu(); time.sleep(10)  # noqa: measured window; idle = cpu() - c0
    with LiveFleet(endpoints=f.endpoints()) as lf:
        time.sleep(1); c0 = cpu(); time.sleep(10)  # noqa: measured window; scraped = cpu() - c0
        n = lf.gateway.metrics.render().count(b"\n")
    print(f"llama-server CPU over 10 s: idle {idle*1000:.0f} ms, scraped at 20 Hz (/metrics + /slots) {scraped*1000:.0f} ms")
finally:
    asyncio.run(f.stop())
