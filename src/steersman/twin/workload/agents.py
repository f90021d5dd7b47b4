"""Agentic workload generators: chatbot, copilot, research agent, autonomous task.

Every application has the same shape, with different numbers (:data:`PRESETS`, in :mod:`.apps`):

* a **shared system prompt** of ``system_prompt_tokens`` (its full blocks hash the
  same for every task of the application, and for every source that names the
  same ``system_prompt_id``);
* **tasks** (a chat session, a copilot task, a research question, an autonomous
  job) arriving as a Poisson process of ``tasks_per_s`` (optionally shaped by a
  daily curve), or run back to back by a fixed population of ``users`` who think
  ``think_s`` between tasks;
* a task makes ``calls`` LLM calls, one at a time.  Call 1's prompt is the system
  prompt plus ``task_tokens`` of task input; call k+1's prompt is call k's prompt
  + call k's output + ``tool_tokens`` (a tool result, or the user's next message),
  so the context grows and each prompt starts with the previous one;
* the next call is sent ``gap_s`` after the previous one completes (tool latency,
  or the user reading and typing) -- closed loop;
* each call generates ``output_tokens`` (capped by ``max_tokens``, which is what
  the request asks for; ``None`` asks for no limit);
* when the next prompt would exceed ``max_context_tokens`` the agent compacts its
  context to the system prompt plus a ``compact_to_tokens`` summary (new blocks
  from then on);
* a failed call is retried after ``retry_backoff_s * 2**(attempt-1)`` up to
  ``retries`` times; then the task is abandoned (its remaining calls are never
  sent).

Each call carries the workflow id (``<source name>-<task number>``), its step k
and the expected number of steps n (the task's call count; ``None`` with
``announce_steps: false``).  A task's content is drawn when it is created, from
the seed and the task number only: two runs that complete calls at different
times still see the same tasks, calls and tokens.

Offered load per task: calls × tokens per call; ``offered_load()`` computes it
(a vectorised Monte Carlo of the context growth, with compaction and caps).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from itertools import islice

import numpy as np

from steersman.twin.workload.apps import PRESETS, AgentApp, preset
from steersman.twin.workload.base import OfferedLoad, Source, SourceInfo, _Draft
from steersman.twin.workload.curve import DailyCurve
from steersman.twin.workload.dists import Dist, as_ints, parse_dist, stream
from steersman.text.tokenizer import BlockHashes
from steersman.twin.workload.hashing import (MAX_KEYS, MAX_SEGMENTS, block_hashes_np, mask, name_namespace,
                                             source_namespace)

__all__ = ["AgentApp", "AgentSource", "PRESETS", "preset"]

class _Plan:
    """A task's content, fixed at creation."""

    __slots__ = ("n", "task_tokens", "outs", "tools", "gaps", "think")

    def __init__(self, n, task_tokens, outs, tools, gaps, think) -> None:
        self.n = n
        self.task_tokens = task_tokens
        self.outs = outs  # n output token counts (already capped by max_tokens)
        self.tools = tools  # n-1 tokens appended after each call's output
        self.gaps = gaps  # n-1 seconds between a completion and the next call
        self.think = think  # user mode: seconds before the user's next task


class _Task:
    __slots__ = ("wid", "plan", "idx", "user", "utask", "k", "attempt", "ctx", "seg", "hashes", "prompt")

    def __init__(self, wid: str, plan: _Plan, idx: int, user: int, utask: int) -> None:
        self.wid = wid
        self.plan = plan
        self.idx = idx
        self.user = user  # -1 for open-loop tasks
        self.utask = utask  # the user's task count (user mode)
        self.k = 1
        self.attempt = 0
        self.ctx = 0  # prompt tokens of the current call
        self.seg = 0  # context compactions so far
        self.hashes: tuple[int, ...] = ()  # every full block the current segment will reach
        self.prompt: tuple[int, ...] = ()  # the current call's full blocks (a prefix of hashes)


def _rng(seed: int | np.random.SeedSequence, i: int) -> np.random.Generator:
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, i))))


class AgentSource(Source):
    """Tasks of one application for one tenant: open loop (``tasks_per_s``) or a user population (``users``)."""

    def __init__(
        self,
        app: AgentApp | str,
        *,
        tenant: str = "default",
        model: str = "default",
        seed: int | np.random.SeedSequence = 0,
        tasks_per_s: float | None = None,
        users: int | None = None,
        think_s: Dist | object = 0.0,
        ramp_s: float = 0.0,
        tasks_per_user: int | None = None,
        max_tasks: int | None = None,
        slo: str | None = None,
        deadline_s: float | None = None,
        start_s: float = 0.0,
        end_s: float | None = None,
        curve: DailyCurve | None = None,
        name: str | None = None,
        block_size: int = 16,
    ) -> None:
        if isinstance(app, str):
            app = preset(app)
        super().__init__(name or app.kind, tenant, model)
        if (tasks_per_s is None) == (users is None):
            raise ValueError("give exactly one of tasks_per_s (open loop) and users (a closed population)")
        if tasks_per_s is not None and not (tasks_per_s > 0 and math.isfinite(tasks_per_s)):
            raise ValueError(f"tasks_per_s must be > 0, got {tasks_per_s!r}")
        if users is not None and (not isinstance(users, int) or users < 1):
            raise ValueError(f"users must be an integer >= 1, got {users!r}")
        if users is not None and curve is not None:
            raise ValueError("a daily curve shapes tasks_per_s; it does not apply to a fixed user population")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        if end_s is not None and end_s < start_s:
            raise ValueError(f"end_s ({end_s}) is before start_s ({start_s})")
        self.app = app
        self.seed = seed
        self.tasks_per_s = tasks_per_s
        self.users = users
        self.think_s = parse_dist(think_s)
        self.ramp_s = float(ramp_s)
        self.tasks_per_user = tasks_per_user
        self.max_tasks = max_tasks
        self.slo = slo
        self.deadline_s = deadline_s
        self.start_s = float(start_s)
        self.end_s = math.inf if end_s is None else float(end_s)
        self.curve = curve
        self.block_size = block_size
        self._tasks: dict[str, _Task] = {}
        self._plans: dict[int, _Plan] = {}
        self._plans_made = 0
        self._ntasks = 0  # open-loop tasks created
        self._next_start = math.inf
        self._starts: Iterator[float] | None = None
        self._expect: tuple[float, ...] | None = None

    # ----- setup
    def _on_bind(self) -> None:
        app = self.app
        seed = self.seed
        cap = app.max_tokens
        floor_task = 0 if app.system_prompt_tokens > 0 else 1
        self._s_calls = stream(app.calls, _rng(seed, 1), integer=True, floor=1)
        self._s_task = stream(app.task_tokens, _rng(seed, 2), integer=True, floor=floor_task)
        self._s_out = stream(app.output_tokens, _rng(seed, 3), integer=True, floor=1, ceil=cap)
        self._s_tool = stream(app.tool_tokens, _rng(seed, 4), integer=True)
        self._s_gap = stream(app.gap_s, _rng(seed, 5))
        self._s_think = stream(self.think_s, _rng(seed, 6))
        bs = self.block_size
        S = app.system_prompt_tokens
        self._nS = S // bs
        ns = name_namespace(app.system_prompt_id) if app.system_prompt_id else source_namespace(self.index, 0)
        self._sys = block_hashes_np(mask(ns), 0, self._nS)
        self._steps_known = app.announce_steps
        if self.tasks_per_s is not None:
            self._starts = self._start_times(_rng(seed, 0))
            self._advance()

    def _start_times(self, rng: np.random.Generator) -> Iterator[float]:
        rate = self.tasks_per_s
        curve = self.curve
        u0 = curve.cumulative(self.start_s) if curve is not None else 0.0
        u = 0.0
        while True:
            us = u + np.cumsum(rng.exponential(1.0 / rate, 2048))
            u = float(us[-1])
            yield from (curve.warp(u0 + us) if curve is not None else self.start_s + us).tolist()

    def _advance(self) -> None:
        if self.max_tasks is not None and self._ntasks >= self.max_tasks:
            self._next_start = math.inf
            return
        t = next(self._starts)
        self._next_start = t if t < self.end_s else math.inf

    def _plan(self, idx: int) -> _Plan:
        plans = self._plans
        while self._plans_made <= idx:
            n = next(self._s_calls)
            plans[self._plans_made] = _Plan(
                n, next(self._s_task), list(islice(self._s_out, n)), list(islice(self._s_tool, n - 1)),
                list(islice(self._s_gap, n - 1)), next(self._s_think),
            )
            self._plans_made += 1
        return plans.pop(idx)

    def _info(self) -> SourceInfo:
        app = self.app
        params: dict[str, object] = {f.name: getattr(app, f.name) for f in dataclasses.fields(app)}
        params.update(tasks_per_s=self.tasks_per_s, users=self.users, think_s=self.think_s, ramp_s=self.ramp_s,
                      tasks_per_user=self.tasks_per_user, max_tasks=self.max_tasks, model=self.model,
                      deadline_s=self.deadline_s, start_s=self.start_s, end_s=self.end_s, curve=self.curve)
        return SourceInfo(self.index, self.name, app.kind, self.tenant, self.slo, True, params)

    # ----- tasks
    def _new_task(self, t: float, idx: int, user: int = -1, utask: int = 0) -> _Draft:
        if idx + 1 >= MAX_KEYS:
            raise OverflowError("too many tasks for one source")
        plan = self._plan(idx)
        task = _Task(f"{self.name}-{idx}", plan, idx, user, utask)
        app = self.app
        S = app.system_prompt_tokens
        T = plan.task_tokens
        cap = app.max_context_tokens
        if cap is not None and S + T > cap:
            T = cap - S
        self._reset_context(task, S + T)
        self._tasks[task.wid] = task
        self._st.tasks_started += 1
        return self._call(task, t)

    def _reset_context(self, task: _Task, ctx: int) -> None:
        """Start a context segment at ``ctx`` tokens: hash, in one go, every block it will reach."""
        if task.seg >= MAX_SEGMENTS:
            raise OverflowError(f"task {task.wid} compacted its context more than {MAX_SEGMENTS - 1} times")
        plan = task.plan
        outs, tools = plan.outs, plan.tools
        cap = self.app.max_context_tokens
        top = ctx  # the segment's last prompt ...
        last = plan.n - 1
        for j in range(task.k - 1, plan.n - 1):  # the context after call j+1, until the next compaction
            nxt = top + outs[j] + tools[j]
            if cap is not None and nxt > cap:
                last = j
                break
            top = nxt
        top += outs[last]  # ... and its output (see continuation_hashes)
        m = mask(source_namespace(self.index, task.idx + 1, task.seg))
        task.hashes = BlockHashes.of(np.concatenate((self._sys, block_hashes_np(m, self._nS, top // self.block_size))))
        task.ctx = ctx
        task.prompt = task.hashes.head(ctx // self.block_size)

    def _call(self, task: _Task, t: float) -> _Draft:
        plan = task.plan
        st = self._st
        st.emitted += 1
        if task.attempt:
            st.retries += 1
        return _Draft(t, 0, self.tenant, self.model, task.ctx, task.prompt, plan.outs[task.k - 1], self.app.max_tokens,
                      self.slo, self.deadline_s, task.wid, task.k, plan.n if self._steps_known else None,
                      task.attempt, self.index)

    def _end_task(self, task: _Task, t: float, ok: bool) -> list[_Draft]:
        del self._tasks[task.wid]
        if ok:
            self._st.tasks_completed += 1
        else:
            self._st.tasks_abandoned += 1
        if task.user < 0:
            return []
        nxt = task.utask + 1
        start = t + task.plan.think
        if start >= self.end_s or (self.tasks_per_user is not None and nxt >= self.tasks_per_user):
            return []
        return [self._new_task(start, nxt * self.users + task.user, task.user, nxt)]

    # ----- hooks
    def _initial(self) -> list[_Draft]:
        if self.users is None:
            return []
        if self.tasks_per_user == 0:
            return []
        offs = _rng(self.seed, 7).uniform(0.0, self.ramp_s, self.users) if self.ramp_s > 0 else np.zeros(self.users)
        out = []
        for u in np.argsort(offs, kind="stable").tolist():
            t = self.start_s + float(offs[u])
            if t < self.end_s:
                out.append(self._new_task(t, u, u, 0))
        return out

    def _pull(self, until: float) -> list[_Draft]:
        out: list[_Draft] = []
        while self._next_start < until:
            out.append(self._new_task(self._next_start, self._ntasks))
            self._ntasks += 1
            self._advance()
        return out

    def _peek(self) -> float:
        return self._next_start

    def _follow(self, a, finished_at: float, ok: bool) -> list[_Draft]:
        task = self._tasks.get(a.workflow) if a.workflow is not None else None
        if task is None or a.step != task.k or a.attempt != task.attempt or a.source != self.index:
            raise ValueError(f"on_complete for an arrival that is not in flight: seq {a.seq}, workflow {a.workflow!r}, "
                             f"step {a.step}, attempt {a.attempt}")
        st = self._st
        plan = task.plan
        k = task.k
        if not ok:
            st.failed += 1
            app = self.app
            if task.attempt < app.retries:
                task.attempt += 1
                return [self._call(task, finished_at + app.retry_backoff_s * (1 << (task.attempt - 1)))]
            return self._end_task(task, finished_at, False)
        st.completed += 1
        if k >= plan.n:
            return self._end_task(task, finished_at, True)
        task.k = k + 1
        task.attempt = 0
        ctx = task.ctx + plan.outs[k - 1] + plan.tools[k - 1]
        cap = self.app.max_context_tokens
        if cap is not None and ctx > cap:
            task.seg += 1
            self._reset_context(task, self.app.system_prompt_tokens + self.app.compact_to_tokens)
        else:
            task.ctx = ctx
            task.prompt = task.hashes.head(ctx // self.block_size)
        return [self._call(task, finished_at + plan.gaps[k - 1])]

    def _idle(self) -> bool:
        return self._next_start == math.inf and not self._tasks

    @property
    def never_ends(self) -> bool:
        """No end_s and no cap on its tasks: it runs until the twin stops it."""
        return self.end_s == math.inf and (self.max_tasks if self.users is None else self.tasks_per_user) is None

    def _continuation(self, a) -> tuple[int, ...]:
        task = self._tasks.get(a.workflow) if a.workflow is not None else None
        if task is None or a.step != task.k or a.attempt != task.attempt:
            return ()
        n = (a.prompt_tokens + a.output_tokens) // self.block_size
        return task.hashes[len(a.block_hashes):n]

    # ----- offered load
    def expectations(self) -> dict[str, float]:
        """Per-task expectations: calls, prompt / output / new prompt tokens summed over calls, gap and think time."""
        if self._expect is None:
            self._expect = self._simulate()
        keys = ("calls", "prompt_tokens", "output_tokens", "new_prompt_tokens", "gap_s", "think_s")
        return dict(zip(keys, self._expect))

    def _simulate(self, trajectories: int = 1000) -> tuple[float, ...]:
        """E[sum over a task's calls] via P(n >= k) * E[per-call value at step k], vectorised over trajectories."""
        app = self.app
        rng = _rng(self.seed, 99)
        bs = self.block_size
        n = as_ints(app.calls.sample(rng, 1 << 17), 1)
        kmax = int(n.max())
        surv = np.cumsum(np.bincount(n, minlength=kmax + 1)[::-1])[::-1][1:] / n.size  # P(n >= k), k = 1..kmax
        S = app.system_prompt_tokens
        nS = S // bs
        cap = app.max_context_tokens
        M = trajectories
        T = as_ints(app.task_tokens.sample(rng, M), 0 if S else 1)
        ctx = S + (np.minimum(T, cap - S) if cap is not None else T)
        matched = np.full(M, nS)
        e_prompt = e_out = e_new = 0.0
        for k in range(kmax):
            out = as_ints(app.output_tokens.sample(rng, M), 1, app.max_tokens)
            w = surv[k]
            e_prompt += w * ctx.mean()
            e_out += w * out.mean()
            e_new += w * (ctx - bs * matched).mean()
            nxt = ctx + out + as_ints(app.tool_tokens.sample(rng, M), 0)
            matched = ctx // bs
            if cap is not None:
                over = nxt > cap
                nxt = np.where(over, S + app.compact_to_tokens, nxt)
                matched = np.where(over, nS, matched)
            ctx = nxt
        calls = float(n.mean())
        gap = max(calls - 1.0, 0.0) * app.gap_s.mean
        return calls, float(e_prompt), float(e_out), float(e_new), gap, self.think_s.mean

    def _load(self, t0: float | None, t1: float | None, latency_s: float) -> OfferedLoad:
        e = self.expectations()
        start, end = self.start_s, self.end_s
        if self.users is not None:
            cycle = e["gap_s"] + e["calls"] * latency_s + e["think_s"]
            if cycle <= 0:
                raise ValueError(f"{self.name}: a user population with no gaps, think time or latency offers infinite load")
            rate = self.users / cycle
            n = self.tasks_per_user
            cap = math.inf if n is None else self.users * n
            if (t0 is None or t1 is None) and n is not None:  # over the run, or the users' n tasks if it has no end
                t0, t1 = start, (end if end < math.inf else start + n * cycle)

            def started(t: float) -> float:  # expected tasks started before t (the ramp aside)
                return min(rate * max(min(t, end) - start, 0.0), cap)
        else:
            rate = self.tasks_per_s
            curve = self.curve
            cap = math.inf if self.max_tasks is None else self.max_tasks
            if t0 is None or t1 is None:
                t0 = start
                if end < math.inf:
                    t1 = end
                elif cap < math.inf:  # the rate while it runs: until the expected last start
                    t1 = curve.warp(curve.cumulative(start) + cap / rate) if curve is not None else start + cap / rate
                else:
                    t1 = t0 + (curve.period_s if curve is not None else 86400.0)

            def started(t: float) -> float:  # expected tasks started before t, up to max_tasks
                x = min(t, end)
                if x <= start:
                    return 0.0
                return min(rate * ((curve.cumulative(x) - curve.cumulative(start)) if curve is not None else x - start),
                           cap)
        if t0 is None or t1 is None:  # a population's steady rate
            tasks = rate
        elif t1 <= t0:
            tasks = 0.0
        else:
            tasks = (started(t1) - started(t0)) / (t1 - t0)
        return OfferedLoad(tasks * e["calls"], tasks * e["prompt_tokens"], tasks * e["output_tokens"],
                           tasks * e["new_prompt_tokens"], tasks, tasks * e["calls"])
