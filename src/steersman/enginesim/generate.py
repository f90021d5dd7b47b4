"""The generation endpoints of engine-sim: a request becomes a job in the engine model."""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Sequence
from dataclasses import replace

import msgspec

from steersman.api.errors import ApiError, bad_request, not_found_model
from steersman.api.prompt import cache_root
from steersman.api.schema import ChatCompletionRequest, CompletionRequest, decode_chat, decode_completion, decode_with
from steersman.clock import Clock
from steersman.config import DEFAULTS
from steersman.enginesim.chunks import ChunkWriter, full_response, usage_of
from steersman.enginesim.faults import Faults
from steersman.enginesim.logprobs import chat_entries, completion_logprobs
from steersman.enginesim.prompts import Prompt, read_prompts, truncation
from steersman.enginesim.runner import EngineRunner, Job
from steersman.enginesim.structured import constraint, structured
from steersman.enginesim.tools import plan_tool_call
from steersman.enginesim.textgen import generate
from steersman.http.server import HttpRequest
from steersman.obs.tracing import OtlpSpans, request_id
from steersman.sim import SimRequest
from steersman.text import block_hashes
from steersman.text.lora import lora_key, rekeyed

__all__ = ["Generator"]

#: output budgets (tokens) generated on the event loop; longer ones in a worker thread (~1 us a token: 4,096 is ~5 ms)
_INLINE_TOKENS = 4096


class Generator:
    """Handles ``/v1/chat/completions`` and ``/v1/completions`` for one replica."""

    def __init__(self, model_name: str, max_model_len: int, block_size: int, mean_output_tokens: float,
                 runner: EngineRunner, faults: Faults, clock: Clock, on_die, priority_scheduling: bool = False,
                 spans: OtlpSpans | None = None, lora_modules: tuple[str, ...] = ()) -> None:
        self.model_name = model_name
        if model_name in lora_modules:
            raise ValueError(f"--lora-modules: {model_name!r} is the model's own name")
        #: the model and each LoRA adapter served -> what its prompts' block hashes are keyed with (0: the model's)
        self.keys = {model_name: 0, **{name: lora_key(name) for name in lora_modules}}
        self.spans = spans  # vLLM's --otlp-traces-endpoint: an ``llm_request`` span per request
        self.priority_scheduling = priority_scheduling
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.mean_output_tokens = mean_output_tokens
        self.runner = runner
        self.faults = faults
        self.clock = clock
        self.on_die = on_die
        self._ids = itertools.count()
        self._id_prefix = secrets.token_hex(4)
        self.vocab: int | None = None  # the model's vocabulary size, once the server sets it

    def hashes(self, ids, salt: str | None, model: str) -> Sequence[int]:
        """The prompt's block hashes in this engine's cache: under its ``cache_salt``, and the adapter's own when
        ``model`` is a LoRA adapter (as vLLM hashes ``lora_name`` into every block)."""
        return rekeyed(block_hashes(ids, self.block_size, cache_root(salt)), self.keys.get(model, 0))

    def new_id(self, kind: str) -> str:
        """An id of this engine's own (unique across requests that bring the same X-Request-Id)."""
        return f"{kind}-{self._id_prefix}{next(self._ids):x}"

    async def chat(self, request: HttpRequest) -> None:
        await self._generate(request, chat=True)

    async def completions(self, request: HttpRequest) -> None:
        await self._generate(request, chat=False)

    def _check(self, req: ChatCompletionRequest | CompletionRequest) -> None:
        if req.model not in self.keys:
            raise not_found_model(req.model)
        if req.priority != 0 and not self.priority_scheduling:  # vLLM's processor refuses it the same way
            raise bad_request(f"Got priority {req.priority} but Priority scheduling is not enabled.", "priority")

    async def _jobs(self, req: ChatCompletionRequest | CompletionRequest, chat: bool, given_id: str | None = None,
                    extras: _Extras | None = None) -> tuple[str, list[Job], list[Prompt]]:
        """The response id, a job per prompt and sample (``n``; choice ``prompt * n + sample``, as vLLM numbers a
        batch's), submitted to the engine, and the prompts.  ``given_id``: the request's ``X-Request-Id``, which
        names the response as vLLM's ``_base_request_id`` does (the engine's own ids stay unique: two requests may
        bring the same header)."""
        self._check(req)
        prompts = read_prompts(req, chat, self.vocab)
        keep = truncation(req.truncate_prompt_tokens, self.max_model_len)
        if keep is not None:  # vLLM keeps the last k tokens of each prompt (left truncation)
            prompts = [replace(pr, ids=pr.ids[-keep:]) for pr in prompts]
        want = req.output_limit
        if want is None and not chat:  # vLLM's CompletionRequest.max_tokens default (chat's: what the context leaves)
            want = DEFAULTS.sim_server.completion_max_tokens
        extras = _NO_EXTRAS if extras is None else extras
        field = "messages" if chat else "prompt"
        rooms = [self.max_model_len - len(pr.ids) for pr in prompts]
        for pr, room in zip(prompts, rooms):
            if not len(pr.ids):  # vLLM: "The decoder prompt cannot be empty"
                raise bad_request(f"`{field}` must not be empty: it has no tokens.", field)
            if room < 1 or (want is not None and want > room):
                raise bad_request(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                    f"{len(pr.ids) + (want or 1)} tokens ({len(pr.ids)} in the {field}, {want or 1} for the completion). "
                    f"Please reduce the length of the `{field}` or completion.",
                    field, "context_length_exceeded",  # OpenAI's code for it
                )
            if extras.min_tokens > (want or room):  # vLLM's SamplingParams._verify_args
                raise bad_request(f"min_tokens must be less than or equal to max_tokens={want or room}, got "
                                  f"{extras.min_tokens}.", "min_tokens")
        stop = () if req.stop is None else ((req.stop,) if isinstance(req.stop, str) else tuple(req.stop))
        kind = "chatcmpl" if chat else "cmpl"
        sid = self.new_id(kind)
        rid = f"{kind}-{given_id}" if given_id else sid
        now = self.clock.now()
        shape = constraint(req)  # structured output (a JSON schema, a JSON object, a choice): what satisfies it
        jobs: list[Job] = []
        try:
            await self._submit(req, chat, prompts, rooms, want, stop, shape, extras, sid, now, field, jobs)
        except BaseException:  # a client gone while a long budget was generated: its samples submitted leave too
            for j in jobs:
                self.runner.cancel(j)
            raise
        return rid, jobs, prompts

    async def _submit(self, req, chat: bool, prompts: list[Prompt], rooms: list[int], want: int | None, stop: tuple,
                      shape, extras: _Extras, sid: str, now: float, field: str, jobs: list[Job]) -> None:
        """Generate and submit a job per prompt and sample into ``jobs``."""
        many = req.n > 1 or len(prompts) > 1
        for k, (pr, room) in enumerate(zip(prompts, rooms)):
            hashes = self.hashes(pr.ids, req.cache_salt, req.model)
            for i in range(req.n):  # vLLM runs a request's samples as sequences of their own, sharing the prompt's blocks
                # greedy (temperature 0) samples are one answer n times, as vLLM's; otherwise each its own
                v = 0 if req.temperature == 0 else i
                call = plan_tool_call(req, pr.context, want or room, v) if chat else None
                if call is not None:
                    gen = call[1]
                elif shape is not None:
                    gen = structured(pr.context, *shape, want or room, variant=v)
                else:
                    args = (pr.context, pr.tail, want or room, self.mean_output_tokens, req.ignore_eos, stop, v,
                            extras.min_tokens, extras.include_stop_str_in_output)
                    # a long budget (no max_tokens: what the context leaves, ~131k tokens) is generated off the event
                    # loop: made whole before its first step, it held every other stream and /health for seconds
                    # (an engine-sim audit: 2.1 s with ignore_eos and n=8); the GIL still yields every 5 ms
                    # (only where the output can be that long: without ignore_eos, EOS ends it after ~mean_output_tokens)
                    long = (want or room) > _INLINE_TOKENS and (req.ignore_eos or extras.min_tokens > _INLINE_TOKENS
                                                                or self.mean_output_tokens > _INLINE_TOKENS / 8)
                    gen = await asyncio.to_thread(generate, *args) if long else generate(*args)
                sim = SimRequest(req_id=f"{sid}-{k * req.n + i}" if many else sid, prompt_len=len(pr.ids),
                                 max_output=len(gen.pieces), block_hashes=hashes, priority=req.priority, arrival=now)
                job = Job(sim=sim, gen=gen, arrival=now, tool=call[0] if call is not None else None, prompt=k)
                try:
                    self.runner.submit(job)
                except ValueError as e:
                    raise bad_request(str(e), field) from None  # (the jobs before it are cancelled by _jobs)
                jobs.append(job)

    async def _generate(self, request: HttpRequest, chat: bool) -> None:
        jobs: list[Job] = []
        given = request.headers.get("x-request-id")
        if given is not None:  # vLLM (--enable-request-id-headers) answers with it
            given = request_id(given)
            request.extra_headers = b"X-Request-Id: %b\r\n" % given.encode()
        span = None
        if self.spans is not None:
            span = self.spans.tracer.start_span("llm_request", context=self.spans.parent(request.headers),
                                                kind=self.spans.kind.SERVER)
        req = rid = None
        try:
            limit = DEFAULTS.gateway.max_tokens_limit
            req = decode_chat(request.body, limit) if chat else decode_completion(request.body, limit)
            if self.faults.should_error():
                raise ApiError(self.faults.spec.error_status, "Injected engine failure.", "server_error", None, "injected_fault")
            top = _alternatives(req)
            rid, jobs, prompts = await self._jobs(req, chat, given, _extras(request.body))
            echoes = [prompts[j.prompt].echo for j in jobs]
            created = int(self.clock.wall())
            if req.stream:
                opts = req.stream_options
                include_usage = bool(opts and opts.include_usage)
                every = include_usage and opts.continuous_usage_stats  # vLLM: usage on every chunk too
                w = ChunkWriter(chat, rid, created, req.model)  # (vLLM answers with the adapter's name too)
                if len(jobs) == 1 and jobs[0].tool is not None:
                    await self._stream(request, jobs[0], w, include_usage, tool=jobs[0].tool, every=every)
                elif len(jobs) == 1 and top is None:  # the common case, on byte templates
                    await self._stream(request, jobs[0], w, include_usage, echoes[0], every=every)
                else:
                    await self._stream_samples(request, jobs, w, include_usage, top, echoes, every)
                return
            choices = []
            for job, echo in zip(jobs, echoes):
                gen = job.gen
                await self.runner.wait(job, len(gen.pieces))
                text = echo + ("".join(gen.pieces[: job.produced]) if job.produced < len(gen.pieces) else gen.text)
                lp = None if top is None else _logprobs(chat, gen.pieces[: job.produced], 0, top, 0)
                choices.append((text, gen.finish_reason, lp))
            usage = _usage(jobs, sum(j.produced for j in jobs))
            tools = [None if j.tool is None else (j.tool.call_id, j.tool.name) for j in jobs] if chat else None
            request.respond(200, full_response(chat, rid, created, req.model, choices, usage, tools))
        except ApiError as e:
            request.respond(e.status, e.body(), extra=e.header_lines())
            if span is not None:
                self.spans.error(span, f"{e.status}: {e.message}")
        finally:
            for job in jobs:
                if not job.done:
                    self.runner.cancel(job)
            if span is not None:
                self._end_span(span, req, jobs, rid)

    def _end_span(self, span, req, jobs: list[Job], rid: str | None) -> None:
        """vLLM's ``llm_request`` span attributes (vllm/tracing.py SpanAttributes), in engine time;
        ``gen_ai.request.id`` the response's id (``chatcmpl-<X-Request-Id>``), as vLLM's, which joins the engine's
        span to the request (it read the engine's internal id)."""
        attrs: dict = {"gen_ai.response.model": self.model_name}
        if jobs:
            produced = sum(j.produced for j in jobs)
            attrs.update({"gen_ai.request.id": rid or jobs[0].sim.req_id,
                          "gen_ai.usage.prompt_tokens": _usage(jobs, produced)["prompt_tokens"],
                          "gen_ai.usage.completion_tokens": produced,
                          "gen_ai.request.n": req.n if req is not None else len(jobs)})
        if req is not None:
            for key, value in (("gen_ai.request.max_tokens", req.output_limit), ("gen_ai.request.temperature", req.temperature),
                               ("gen_ai.request.top_p", req.top_p)):
                if value is not None:
                    attrs[key] = value
        span.set_attributes(attrs)
        span.end()

    async def _stream(self, request: HttpRequest, job: Job, w: ChunkWriter, include_usage: bool, echo: str = "",
                      tool=None, every: bool = False) -> None:
        """One sample's stream: content tokens, or (``tool``) a tool call's id and name, then its arguments;
        ``every``: each chunk carries the usage so far (vLLM's ``continuous_usage_stats``)."""
        request.start_stream()
        # like vLLM, the assistant-role chunk goes out together with the first token; an echoed prompt comes first
        head = w.role() if w.chat else (w.token(echo) if echo else b"")
        event = w.token
        if tool is not None:
            head += w.tool_start(tool.call_id, tool.name)
            event = w.tool_args
        if every:
            head, event = _usage_on_every(w, job.sim.prompt_len, head, event)
        pieces = job.gen.pieces
        total = len(pieces)
        last = total - 1
        reason = job.gen.finish_reason
        sent = 0
        while sent < total:
            await self.runner.wait(job, sent)
            ready = min(job.produced, total)
            if ready <= sent:
                if job.done:
                    break
                continue
            n = self.faults.tokens_allowed(ready - sent)
            request.send(head + b"".join(event(pieces[i], reason if i == last else None) for i in range(sent, sent + n)))
            head = b""
            sent += n
            if self.faults.streamed(n):
                await self.on_die()
                return
            await request.drain()
        tail = head
        if include_usage:
            tail += w.usage(usage_of(job.sim.prompt_len, sent, job.sim.num_cached_tokens))
        request.send(tail + w.done())
        request.end_stream()

    async def _stream_samples(self, request: HttpRequest, jobs: list[Job], w: ChunkWriter, include_usage: bool,
                              top: int | None, echoes: list[str], every: bool = False) -> None:
        """Several samples (``n`` > 1), or log probabilities: each sample's events as its tokens come, with its
        choice index (vLLM interleaves the samples) and each token's log probabilities when asked for; a sample
        that calls a tool streams the call (its id and name, then its arguments); ``every``: each chunk carries
        its choice's usage so far (vLLM's ``continuous_usage_stats``)."""
        request.start_stream()
        k = len(jobs)
        heads = [w.role(c) if w.chat else (w.event(c, echoes[c], None, None) if echoes[c] else b"") for c in range(k)]
        for c, job in enumerate(jobs):
            if job.tool is not None:
                heads[c] += w.tool_start(job.tool.call_id, job.tool.name, c)
        if every:
            heads = [_no_output_yet(w, h, job.sim.prompt_len) for h, job in zip(heads, jobs)]
        head = b"".join(heads)
        sent, offset = [0] * k, [0] * k
        while True:
            out, count, held = [head], 0, False
            for c, job in enumerate(jobs):
                pieces, reason = job.gen.pieces, job.gen.finish_reason
                last = len(pieces) - 1
                want = max(min(job.produced, len(pieces)) - sent[c], 0)
                n = self.faults.tokens_allowed(count + want) - count  # a die-after fault counts every sample's tokens
                held = held or n < want
                for i in range(sent[c], sent[c] + n):
                    lp = None
                    if top is not None:
                        offset[c] += len(pieces[i - 1]) if i else 0
                        lp = _logprobs(w.chat, pieces[i : i + 1], i, top, offset[c])
                    fr = reason if i == last else None
                    ev = w.event(c, pieces[i], fr, lp) if job.tool is None else w.tool_args(pieces[i], fr, c)
                    out.append(w.with_usage(ev, job.sim.prompt_len, i + 1) if every else ev)
                sent[c] += n
                count += n
            if count:
                request.send(b"".join(out))
                head = b""
            if (count or held) and self.faults.streamed(count):  # held: tokens are ready but the budget is spent
                await self.on_die()
                return
            if count:
                await request.drain()
            waiting = [c for c, job in enumerate(jobs) if sent[c] < len(job.gen.pieces) and not job.done]
            if not waiting:
                if all(sent[c] >= min(j.produced, len(j.gen.pieces)) for c, j in enumerate(jobs)):
                    break
                continue  # the last tokens of a sample that just finished
            if not count:
                await self.runner.wait(jobs[waiting[0]], sent[waiting[0]])
        tail = head
        if include_usage:
            tail += w.usage(_usage(jobs, sum(sent)))
        request.send(tail + w.done())
        request.end_stream()


class _Extras(msgspec.Struct):
    """vLLM's sampling parameters the shared request schema does not read (the gateway forwards them untouched)."""

    min_tokens: int = 0
    include_stop_str_in_output: bool = False


_NO_EXTRAS = _Extras()
_extras_decoder = msgspec.json.Decoder(_Extras)


def _extras(body: bytes) -> _Extras:
    """The body's vLLM extensions; a second decode only when a body names one (most do not)."""
    if b"min_tokens" not in body and b"include_stop_str_in_output" not in body:
        return _NO_EXTRAS
    extras = decode_with(_extras_decoder, body)
    if extras.min_tokens < 0:  # vLLM's SamplingParams._verify_args
        raise bad_request(f"min_tokens must be greater than or equal to 0, got {extras.min_tokens}.", "min_tokens")
    return extras


def _no_output_yet(w: ChunkWriter, head: bytes, prompt_tokens: int) -> bytes:
    """A stream's head chunks (role, echo, tool call start) each with the usage before any output token (JSON
    chunks hold no raw blank line: splitting at one finds each chunk)."""
    return b"".join(w.with_usage(e + b"\n\n", prompt_tokens, 0) for e in head.split(b"\n\n")[:-1])


def _usage_on_every(w: ChunkWriter, prompt_tokens: int, head: bytes, event):
    """The head chunks (none of the output yet) and a token event maker whose chunks carry the usage so far."""
    head = _no_output_yet(w, head, prompt_tokens)
    done = itertools.count(1)

    def counted(text: str, finish_reason: str | None = None) -> bytes:
        return w.with_usage(event(text, finish_reason), prompt_tokens, next(done))

    return head, counted


def _alternatives(req: ChatCompletionRequest | CompletionRequest) -> int | None:
    """Log-probability alternatives per token the request asks for; None: no logprobs."""
    if isinstance(req, ChatCompletionRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


def _usage(jobs: list[Job], produced: int) -> dict:
    """Usage of a request's jobs: each prompt's tokens (and cached tokens) once, whatever its samples."""
    firsts = {j.prompt: j.sim for j in reversed(jobs)}  # the first job of each prompt
    return usage_of(sum(s.prompt_len for s in firsts.values()), produced,
                    sum(s.num_cached_tokens for s in firsts.values()))


def _logprobs(chat: bool, pieces: list[str], start: int, top: int, offset: int) -> dict:
    if chat:
        return {"content": chat_entries(pieces, start, top)}
    return completion_logprobs(pieces, start, top, offset)
