"""``steersman plan``: the cheapest fleet that meets the SLO, by simulation, and replicas per hour."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from steersman.config import DEFAULTS

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan(
        workload: Path | None = typer.Option(None, "--workload", help="Workload spec (YAML): the peak-hour load to serve."),
        trace: Path | None = typer.Option(None, "--trace", help="Or a trace (Azure CSV or Mooncake JSONL) as that load."),
        speed: float = typer.Option(1.0, help="--trace: replayed this many times faster (a trace scaled up)."),
        limit: int | None = typer.Option(None, help="--trace: at most this many requests."),
        model: str = typer.Option("llama-3.1-8b", help="--trace: the model its requests ask for."),
        slo: float = typer.Option(DEFAULTS.twin.plan_slo, "--slo", help="Share of requests that must meet their SLO class targets."),
        gpus: str = typer.Option("H100,A100,L40S", "--gpus", help="Candidate GPU types, comma separated."),
        headroom: float = typer.Option(DEFAULTS.twin.plan_headroom, help="Size for the load times (1 + headroom)."),
        policy: str | None = typer.Option(None, show_default=False,
                                          help="Routing profile to plan with.  [default: --fleet's policy, else steersman]"),
        tp: int = typer.Option(1, help="Tensor-parallel degree of each replica."),
        duration: float | None = typer.Option(None, help="Simulated seconds per trial (default: the workload's duration_s)."),
        fleet: Path | None = typer.Option(None, "--fleet", help="Take scheduler / admission / tenants from this fleet file."),
        seed: int | None = typer.Option(None, help="Seed of every random draw (default: the workload's seed, else 0)."),
        workers: int = typer.Option(DEFAULTS.twin.plan_workers, help="GPU types searched in this many processes at once."),
    ) -> None:
        """Find the cheapest fleet (replicas per GPU type) meeting the SLO with headroom; show it per hour."""
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        from steersman.cli._workload import check_duration, workload_spec
        from steersman.twin.plan import day_curve_text, plan_capacity
        from steersman.twin.plan_mix import label
        from steersman.twin.run import check_workload
        from steersman.twin.workload import WorkloadSpecError, load_workload

        con = Console(width=max(120, Console().width))
        if not 0 < slo <= 1:
            raise typer.BadParameter(f"--slo must be in (0, 1], got {slo:g}")
        if not (math.isfinite(headroom) and headroom >= 0):  # (nan < 0 is False: a NaN passed)
            raise typer.BadParameter(f"--headroom must be a finite number >= 0, got {headroom:g}")
        if workers < 1:
            raise typer.BadParameter(f"--workers must be >= 1, got {workers}")
        try:
            check_duration(duration)
            spec, base = workload_spec(workload, trace, speed, limit, model)
            if duration is not None:  # every source's default end, as in simulate (and the offered load's window)
                spec = {**spec, "duration_s": duration}
            # what every trial would run wrongly or forever (plan_capacity would call it infeasible): refused now
            wl = load_workload(spec, seed, base_dir=base)
            check_workload(wl, spec.get("duration_s"))
            _check_plannable(spec, wl)
            base_fleet = _fleet_file(fleet) if fleet else None
            p = plan_capacity(spec, [g.strip() for g in gpus.split(",") if g.strip()], target=slo, headroom=headroom,
                              policy=policy, tp=tp, seed=seed, base_dir=base, duration_s=duration, base_fleet=base_fleet,
                              workers=workers,
                              progress=lambda msg: con.print(f"  [dim]{escape(msg)}[/]"))
        except (WorkloadSpecError, OSError, KeyError, ValueError) as e:
            con.print(f"[red]steersman plan:[/] {escape(str(e.args[0] if isinstance(e, KeyError) and e.args else e))}")
            raise typer.Exit(2) from None
        t = Table(title=f"plan for {p.model}: {p.offered_rps:.2f} req/s offered, SLO {100 * slo:g}% at +{100 * headroom:g}% load")
        for col in ("fleet", "replicas", "$ / hour", "SLO met", "$ / successful task", "req/s per replica"):
            t.add_column(col, justify="right" if col != "fleet" else "left")
        for o in sorted(p.options, key=lambda o: (o.cost_per_hour, o.mixed)):
            star = " *" if o is p.best else ""
            t.add_row(o.gpu + star, str(o.replicas), f"{o.cost_per_hour:.2f}", f"{100 * o.slo_attainment:.1f}%",
                      f"{o.cost_per_successful_task:.5f}" if o.cost_per_successful_task else "-", f"{o.per_replica_rps:.2f}")
        con.print(t)
        for gpu, why in p.infeasible.items():
            con.print(f"[yellow]{gpu}[/]: {escape(why)}")
        short = [f"{label(f)} ({100 * a:.1f}%)" for f, a in p.mixed_tried if not any(o.fleet == f for o in p.options)]
        if short:
            con.print(f"[dim]cheaper mixes simulated that fell short: {', '.join(short)}[/]")
        if p.best is None:
            con.print(f"[red]steersman plan:[/] no fleet of {escape(gpus)} meets the SLO (the reasons per GPU type are above)")
            raise typer.Exit(1)
        b = p.best
        con.print(f"cheapest: [bold]{label(b.fleet)}[/] at ${b.cost_per_hour:.2f}/h"
                  f"  ({p.trials} twin runs)")
        h = Table(title=f"elasticity over a day (the cheapest fleet covering each hour; the day's load: "
                        f"{day_curve_text()})")
        h.add_column("hour")
        h.add_column("offered req/s", justify="right")
        h.add_column("fleet")
        h.add_column("$ / hour", justify="right")
        for hour, rps, fl, cost in p.hourly:
            h.add_row(f"{hour:02d}:00", f"{rps:.2f}", label(fl), f"{cost:.2f}")
        con.print(h)
        day = sum(cost for *_, cost in p.hourly)
        con.print(f"a day elastic: ${day:.2f}  vs  static peak fleet: ${24 * b.cost_per_hour:.2f}")


def _check_plannable(spec: dict, wl) -> None:
    """ValueError for a workload plan cannot size: sources asking for another model than the spec's (plan builds
    fleets of that one model, so every such request was refused and each GPU type read "out of reach"), or
    failure drills (they name a fleet's replicas, and plan tries fleets of its own: each GPU type read infeasible
    for the drill's replica name)."""
    model = spec.get("model")
    for src in getattr(wl, "leaves", ()):
        if src.model != model:
            raise ValueError(f"workload source {src.name!r} asks for model {src.model!r}: plan sizes a fleet of one "
                             f"model (the spec's, {model!r}); plan each model's workload on its own")
    if spec.get("drills"):
        raise ValueError("the workload has drills: plan sizes fleets without failures (run drills with "
                         "steersman simulate on the planned fleet)")


def _fleet_file(path: Path) -> dict:
    """The ``--fleet`` file's mapping (its scheduler, admission and tenants apply to every fleet tried; plan_capacity
    checks them); ValueError naming the file if it is not YAML of a mapping."""
    import yaml

    from steersman.fleet.config import load_yaml

    try:
        data = load_yaml(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ValueError(f"cannot read fleet file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"cannot read {path}: not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML: {e}") from None
    if data is not None and not isinstance(data, dict):
        raise ValueError(f"{path}: a fleet file is a mapping (scheduler, admission, tenants, ...)")
    return data or {}
