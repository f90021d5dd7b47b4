"""Settings of the scheduler: fleet accounting, saturation, prefix index, SLO classes."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from collections.abc import Mapping

from steersman.config._base import check_bounds, setting
from steersman.config.admission import PRIORITY_CLASSES

__all__ = ["SchedulerSettings", "SloClass"]


@dataclass(frozen=True, slots=True)
class SloClass:
    ttft_s: float | None
    tpot_s: float | None


_SLO = MappingProxyType(
    {
        "interactive": SloClass(0.45, 0.040),
        "standard": SloClass(2.0, 0.200),
        "batch": SloClass(None, None),
    }
)


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    profile: str = setting("steersman", "issue #3: the default profile is the model-based one")
    slo_classes: Mapping[str, SloClass] = setting(
        _SLO,
        "MLPerf Inference v5.0 Llama-2-70B latency constraints: interactive TTFT 450 ms / TPOT 40 ms, "
        "server (standard) TTFT 2 s / TPOT 200 ms; batch has no latency target (OpenAI Batch API: 24 h window)",
    )
    default_slo: str = setting("standard", "requests that name no SLO class get the server scenario targets")
    latency_ewma_alpha: float = setting(0.2, "Netflix concurrency-limits Gradient2Limit smoothing default 0.2", gt=0, le=1)
    latency_ewma_tau_s: float = setting(
        1.0, "Finagle's peak-EWMA load balancer decays its latency average with time (decayTime), not per sample: "
        "per replica, a learnt latency or correction ratio weighs an observation 1 - exp(-dt / 1 s), at most "
        "latency_ewma_alpha, so its memory is ~1 s whatever the request rate (per sample, it tracked the last ~5 "
        "requests at thousands a second and routing swung between two identical engine-sims at 64 streams: "
        "mean |running difference| 6.5-11.6 against 4.7-5.0; bench/policies spread over 5 loads: goodput vs the "
        "best baseline Mooncake 1.024 -> 1.083, Azure code 0.923 -> 0.936, agentic 0.988 = 0.988, its tasks per $ "
        "0.952 -> 0.919); 0: the per-sample weight alone"
    )
    recent_load_tau_s: float = setting(
        60.0, "Preble weighs load over a recent window H; we decay routed work with a 60 s time constant", gt=0
    )
    prefix_index_max_mib: float = setting(
        128.0, "bounded approximate prefix index (peers grow until OOM): 128 MiB ~ 2M block entries (a compiled table, "
        "~32 bytes a block).  At least 0.03 MiB: the index's smallest table (1,024 slots) and its fixed part for one "
        "replica, ~120 bytes more each (0.06 MiB for 256): a fleet file is checked for its replicas",
        ge=0.03
    )
    prefix_residency: bool = setting(
        True, "vLLM's prefix cache evicts its least recently used free blocks (vllm/v1/core/block_pool.py), and "
        "the Gateway API Inference Extension's approximate prefix plugin keeps an LRU per server of the engine's "
        "own cache size (NumOfGPUBlocks: CacheNumBlocks with AutoTune, else DefaultLRUCapacityPerServer 31,250, an "
        "H100's for Llama 3 8B): the index credits a replica only with the generations its KV cache (the engine's "
        "reported or modelled blocks) still holds (predictions, saturation, accounting; the holders-first rule "
        "keeps the raw match: a workflow goes back where its context was sent).  Whole "
        "Mooncake trace (bench/policies): without it a fifth of the requests were predicted to find ~22,000 prompt "
        "tokens cached that the engine had evicted (the gateway's pending prefill 44% under the engines' real one)"
    )
    kv_events: bool = setting(
        False, "vLLM publishes its prefix cache's changes only when started with --kv-events-config (off by "
        "default; NVIDIA Dynamo's KV router and llm-d's precise-prefix-cache-scorer consume them): True makes every "
        "simulated replica publish them (the twin's; engine-sims a fleet file's simulated: section starts, over "
        "ZMQ) and the prefix index take each replica's match from them (steersman.fleet.kv_events): what it holds "
        "now, not a guess from what was routed there; in the twin, for a profile that reads them (steersman's; "
        "dynamo-kv's, as Dynamo's router does).  A real engine's endpoint names its own (endpoints[].kv_events)"
    )
    kv_events_mismatch_after: int = setting(
        32, "design: a replica's KV events whose hashes never match the gateway's prompts (an engine tokenizing "
        "otherwise: a real vLLM, whose token ids are its model's) would hide every prefix hit there; once its engine "
        "has reported this many prefix hits the events had not predicted, and they never predicted one, the index "
        "stops reading them and learns that replica from routing again (logged)", ge=1
    )
    kv_events_replay_timeout_s: float = setting(
        2.0, "design: a KV events replay (endpoints[].kv_events_replay: vLLM's replay_endpoint) that has not ended "
        "within this is given up (counted replay_failed; the events go on); vLLM's example subscriber waits 200 ms "
        "for each reply, and a public Rust replay client for SGLang's publisher (the same protocol) gives a replay 2 s",
        gt=0
    )
    decode_picker: str = setting(
        "least-loaded", "prefill/decode disaggregation: the decode replica with the fewest requests handed to it and "
        "not finished (steersman.policy.decode); NVIDIA Dynamo's router routes the decode stage without "
        "prefix-overlap scoring too (docs: Disaggregated Serving)"
    )
    saturation_queue_depth: int = setting(5, "Gateway API Inference Extension saturation detector queueDepthThreshold 5")
    saturation_kv_usage: float = setting(0.8, "Gateway API Inference Extension saturation detector kvCacheUtilThreshold 0.8", gt=0, le=1)
    saturation_affinity_factor: float = setting(
        4.0, "design, measured in bench/policies (full Mooncake trace, goodput 0.70x -> 1.00x llm-d with the raw-match "
        "exploit rule; 2x gave 0.95x, 4x and unbounded the same): a replica holding most of a request's prompt (index "
        "match >= exploit_share) is saturated for it only at 4x the queue depth, whatever its KV usage: the request's "
        "place is in that replica's queue (its prefill mostly skipped), not in the gateway's, where it would go to "
        "whichever replica frees first and compute its prompt again", gt=0
    )
    saturation_staleness_s: float = setting(
        0.2, "Gateway API Inference Extension metricsStalenessThreshold 200 ms: stale metrics count as saturated", gt=0
    )
    initial_output_estimate: int = setting(
        211, "expected output tokens before any are observed: mean of the Azure LLM 2023 conversation trace", ge=1
    )
    unprofiled_prefill_s_per_token: float = setting(
        0.001, "replicas without a GPU profile (llama.cpp): prior prompt-processing time, 1 ms/token (~1k tok/s, "
        "llama.cpp llama-bench pp512 order for sub-1B Q4 models on CPU), until the engine's own timing counters are read "
        "(llama.cpp prompt_seconds_total); each replica's observed/predicted ratio corrects it", gt=0
    )
    unprofiled_decode_step_s: float = setting(
        0.05, "replicas without a GPU profile: prior decode step (and first-token overhead) 50 ms, 20 tok/s; "
        "replaced by the engine's own timing once read (llama.cpp tokens_predicted_seconds_total); corrected per "
        "replica by the observed/predicted TPOT ratio", gt=0
    )
    unprofiled_tpot_pool_spread: float = setting(
        10.0, "measured (bench/peers/trace.py, two identical llama-servers): the learnt TPOTs of identical replicas "
        "drift apart with the prefills each happened to run beside its decodes (median 1.5x, p90 4.5x, max 7.3x over "
        "135 decisions of three runs), and the latency-first picker sent 11-18 of ~35 equally cached requests to the "
        "busier replica; so an unprofiled replica's learnt TPOT is pooled over the replicas configured alike while "
        "within 10x of theirs (4x left 13% of decisions unpooled: bench/peers 5 rounds, TTFT p50 144 vs 179 ms, "
        "p99 1,007 vs 1,210 ms); further away (a degraded host) it keeps its own; 1 turns pooling off", ge=1
    )
    safety_margin: float = setting(
        0.8, "design: a protected request (critical, or a workflow with sunk cost) may use 80% of its budget; "
        "predictions are estimates, so protected traffic keeps 20% in reserve", gt=0, le=1
    )
    cost_tie: float = setting(
        1.05, "design: replicas within 5% of the cheapest feasible predicted cost count as equally cheap; "
        "the weighted scores decide among them", ge=1
    )
    exploit_share: float = setting(
        0.5, "Preble E2 (Srivatsa et al., ICLR 2025): exploit a cached prefix when it is longer than the "
        "uncached rest (> 50% of the prompt; the index's raw match, as Preble's own tree, not the residency-"
        "discounted one the predictions use): the replicas holding the longest prefix are preferred whenever "
        "one of them meets the budget (or none anywhere does, or the request is not protected and they are within "
        "exploit_slowdown: a standard request stays with its prompt rather than have it computed again elsewhere): "
        "a prefill avoided frees the fleet, not only this request"
    )
    exploit_slowdown: float = setting(
        4.0, "design: when no replica meets the budget, the holders of the longest prefix are still preferred "
        "unless their least predicted end-to-end latency is over 4x the fleet's least (a hot prefix's replica "
        "far behind the others gives its request to the faster one); bench/policies, full Mooncake trace: 2x "
        "0.94x, 4x 1.00x, 8x 1.03x llm-d's goodput, agentic mix unchanged from 4x on (a request computed "
        "elsewhere also evicts other prefixes there)", ge=1
    )
    shed_infeasible: tuple[str, ...] = setting(
        ("sheddable",),
        "Mooncake (Qin et al., FAST 2025, section 7: early rejection) refuses at once what it predicts it cannot "
        "serve in time rather than run it late, slowing the requests that can still meet their SLO: a request of "
        "these priority classes (unprotected, not a resumed stream) that no replica is predicted to serve within "
        "its TTFT/TPOT/deadline gets 503 slo_infeasible with Retry-After.  Default: only 'sheddable', the band "
        "shed first (issue #3); add 'standard' for Mooncake's policy (bench/policies, whole Mooncake trace at "
        "90% load: SLO met 70.6% -> 81.8%, 7% refused)"
    )
    no_replica_retry_after_s: float = setting(
        1.0, "Retry-After of a 503 no replica can take now (none serving the model in rotation, none passing the "
        "filters, a reroute with none left, a queued request whose replicas all left, one shed from the queue or "
        "refused a place in it, "
        "sheddable traffic browned out): the gateway learns of a replica back "
        "at its next scrape (50 ms) and a breaker half-opens in seconds, so 1 s, the least a whole-second header "
        "says (RFC 9110 10.2.3; the OpenAI SDK waits what it says, up to 60 s); refusals that know their wait "
        "(rate limits, budgets, an open breaker's remaining time) say that instead", gt=0,
    )
    queue_without_replica_s: float = setting(
        5.0, "steersman (twenty-seventh session's review): requests queued for a model whose replicas all left "
        "rotation (crashed, ejected, restarting) wait this long for one to come back, then get the 503 no_capacity "
        "(Retry-After 1 s) a new arrival gets at once; without it a queued request without a deadline waited for "
        "its client to give up (the OpenAI SDK: 600 s).  A few scrape intervals plus a restart's worth", gt=0,
    )
    hold_late: bool = setting(
        True, "bench/policies (twenty-third session): an unprotected request that no replica is predicted to serve "
        "within its TTFT now, but one could once the prefill queued ahead of it has drained, waits in the gateway "
        "queue instead of joining an engine queue that makes it late (and every request queued after it there); "
        "the queue serves first the requests whose TTFT budget has not run out (the rest when none can use the "
        "capacity), and a held one goes where it finishes soonest once its budget is spent.  A request whose prompt "
        "a replica mostly holds (exploit_share) is not held: its place is in that replica's queue (held, it had "
        "cost the whole Mooncake trace -9%..+2.5% over five loads); a first token (a prefill done) wakes the "
        "queue; a released request is judged on the TTFT budget it has left.  With the saturation detector's "
        "token-budget estimate, goodput over 0.96-1.04x of each calibrated load (spread.py): Azure code 0.923x -> "
        "1.087x dynamo-kv, Mooncake 1.250x -> 1.262x, the agentic mix unchanged (its late requests are protected or "
        "hold their prompt)"
    )
    slot_wait: bool = setting(
        True, "llama.cpp reuses a prompt only from a free slot (steersman.fleet.slots): a request whose prompt a "
        "running request there will leave in its slot waits in the gateway for that slot when its first token is "
        "predicted to come sooner that way (the running request's predicted end, then the rest of its prompt) "
        "than anywhere now.  Measured on 2 llama-server replicas of Gemma 3 270M (bench/peers, first wave: 4 "
        "requests with one uncached 311-token prompt split 2 + 2 computed two copies per engine at once, 3.4-4.3 s "
        "to the first token; 1 + 1 with the other two waiting for the slots: ~2.3-2.5 s).  Only replicas with a "
        "slot mirror (llama.cpp) and without a roofline profile; never protected requests or resumed streams"
    )
    slot_wait_gain: float = setting(
        0.8, "design: waiting for a slot must be predicted to give the first token at least 20% sooner than "
        "the best replica now (the prediction of a holder's end is a mean; a small gain is not worth the risk)", le=1
    )
    slot_wait_overrun: float = setting(
        0.5, "design: a running request past its predicted end is predicted to end after another half of the time "
        "it has overrun (a late estimate is late by more: the wait for it grows with its lateness and ends once "
        "another replica is predicted sooner; a fixed cut-off at 50% past the predicted end sent the waiters of a "
        "uniformly slow fleet to compute extra copies of the prompt: tests/real/test_llamacpp_slot_wait.py)"
    )
    demote_late: bool = setting(
        True, "vLLM --scheduling-policy priority serves lower 'priority' first, then by arrival: to an engine that "
        "runs it (endpoint scheduling: priority) each request goes with 2 x its band, plus 1 when no replica was "
        "predicted to meet its SLO (design: the requests that can still meet theirs go first inside the band, as "
        "deadline-aware schedulers do; bench/policies, whole Mooncake trace on priority engines: SLO met "
        "70.6% -> 73.2%); false: the band alone"
    )
    latency_tie: float = setting(
        1.10, "design: when some replica meets the budget, the equally cheap ones within 10% of the least predicted "
        "end-to-end latency count as equally fast (the scores, e.g. prefix affinity, decide then), so a "
        "prediction's last 10% does not send a request away from its cached prompt, and a stalled replica does "
        "not win on price", ge=1
    )
    balance_tie: float = setting(
        0.15, "bench/overhead rounds.py (64 closed-loop streams over 2 engine-sims, 8 rounds): the load-balance "
        "score counts a candidate whose load (in flight + waiting, + 1) is within 15% of the least loaded one's as "
        "least loaded, so near-equal loads tie and the request's sequence number rotates among them.  Ranking by "
        "one request more in a batch of 32 (join-the-shortest-queue) sends each finished request's successor back "
        "to the replica it just left; requests that start together end together, so such cohorts persist: added "
        "TTFT p50 +0.43 -> +0.16 ms (round-robin +0.10).  bench/policies spread.py (5 loads, 0.92-1.08x): Azure "
        "code 0.944 -> 0.937x dynamo-kv, Mooncake 1.102 -> 1.085x llm-d, agentic 1.003 -> 1.000x preble-e2 "
        "(tasks per $ 0.963 -> 0.956x), within those runs' spread (single loads move +-5%); "
        "0: strict min-max, as before"
    )
    kv_headroom_tie: float = setting(
        0.01, "the same run: KV headroom scores within 0.01 (1% of the KV cache) of the best count as the best.  "
        "Usage is scraped (every metrics interval), so between two scrapes every near-tie went to the replica "
        "whose last reading was lowest; a band on loads alone (then a ratio outside it) left the added TTFT where it "
        "was (+0.42 vs +0.37 ms).  "
        "0.05 tied real differences too: Azure code 0.944 -> 0.889x dynamo-kv.  0: strict, as before; below 1 "
        "(a band of the whole cache would tie every reading)", lt=1
    )
    late_latency_tie: float = setting(
        2.0, "bench/policies (spread.py, 9 loads around the calibrated one, 0.92-1.08x): when no replica is "
        "predicted to meet the budget, every candidate within 2x the least predicted end-to-end latency counts "
        "as equally late and the scores (load, prefix, KV headroom) decide: ranking late options by latency "
        "(within latency_tie) sent the late work to the fastest replicas, crowding out requests they could "
        "still serve on time.  Goodput vs the best baseline, 1.10 -> 2: Mooncake 1.052 -> 1.080x llm-d, "
        "agentic 0.973 -> 0.986x preble-e2 (tasks per $ 0.944 -> 0.957x), Azure code 0.940 -> 0.937x, Azure "
        "conv 1.00x.  The late requests' tail grows with the tie: Mooncake TTFT p99, median over the loads, "
        "10.5 s -> 14.0 s at 2x, 22.2 s at 4x (llm-d 15.6 s), for no more goodput (4x: 1.075, 0.994, 0.943).  "
        "At most exploit_slowdown: a replica further behind (a hot prefix's holder far overloaded, a stalled "
        "one until ejected) is not a candidate, or prefix affinity would win it back the request "
        "exploit_slowdown took away", ge=1, le="exploit_slowdown"
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        bad = [c for c in self.shed_infeasible if c not in PRIORITY_CLASSES]
        if bad:
            raise ValueError(f"shed_infeasible: unknown priority class(es) {bad}; known: {list(PRIORITY_CLASSES)}")
        if "critical" in self.shed_infeasible:
            raise ValueError("shed_infeasible: 'critical' requests are never shed (they get the safety margin instead)")
