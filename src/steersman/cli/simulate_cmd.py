"""``steersman simulate``: the digital twin, several policies side by side."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        fleet: Path = typer.Option(..., "--fleet", help="Fleet file (YAML): simulated replicas, scheduler, tenants."),
        workload: Path | None = typer.Option(None, "--workload", help="Workload spec (YAML)."),
        trace: Path | None = typer.Option(None, "--trace", help="A trace to replay instead (Azure CSV or Mooncake JSONL)."),
        speed: float = typer.Option(1.0, help="--trace: replay this many times faster."),
        limit: int | None = typer.Option(None, help="--trace: at most this many requests."),
        model: str = typer.Option("llama-3.1-8b", help="--trace: the model its requests ask for."),
        policy: list[str] = typer.Option([], "--policy", show_default=False,
                                         help="A routing profile; repeat to compare.  [default: the fleet file's policy]"),
        load: str = typer.Option("1", help="Offered-load multipliers, comma separated (e.g. 0.5,1,1.5)."),
        duration: float | None = typer.Option(None, help="Simulated seconds of arrivals (default: the workload's duration_s)."),
        seed: int | None = typer.Option(None, help="Seed of every random draw (default: the workload's seed, else 0)."),
        out: Path = typer.Option(Path("twin-results"), "--out", help="Directory for results.json and plots."),
        plots: bool = typer.Option(True, help="Write PNG plots."),
    ) -> None:
        """Run the real control plane against a simulated fleet; compare policies (table, results.json, plots)."""
        import time

        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from steersman.cli._workload import check_duration, parse_loads, workload_spec
        from steersman.fleet.config import FleetConfigError, load_fleet
        from steersman.twin import report
        from steersman.twin.run import Experiment
        from steersman.twin.workload import WorkloadSpecError

        con = Console(width=max(180, Console().width))
        try:
            loads = parse_loads(load)
            check_duration(duration)
            cfg = load_fleet(fleet)
            spec, base = workload_spec(workload, trace, speed, limit, model)
            exp = Experiment(cfg, spec, base, seed, duration)
            # the fleet file's own routing profile unless others are asked for; named twice, one runs (and is listed)
            policy = list(dict.fromkeys(policy or [cfg.policy]))
            exp.check(policy)  # before the progress bars: what would fail a run fails now, naming its field
            out.mkdir(parents=True, exist_ok=True)  # before the runs: an --out that cannot be a directory lost them
        except (FleetConfigError, WorkloadSpecError, OSError, KeyError, ValueError) as e:
            con.print(f"[red]steersman simulate:[/] {_message(e)}")
            raise typer.Exit(2) from None
        horizon = duration or spec.get("duration_s") or 0.0
        t0 = time.perf_counter()
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                      TimeElapsedColumn(), console=con) as prog:
            def factory(policy, ld):
                task = prog.add_task(f"{policy} @ {ld:g}x", total=horizon or None, info="")

                def update(t, n):
                    prog.update(task, completed=min(t, horizon) if horizon else None, info=f"{n:,} requests, t={t:,.0f}s")

                return update

            try:
                exp.sweep(policy, loads, factory)
            except (WorkloadSpecError, FleetConfigError, KeyError, ValueError) as e:
                con.print(f"[red]steersman simulate:[/] {_message(e)}")
                raise typer.Exit(2) from None
        con.print(report.table(exp.runs))
        for ld, s in next(iter(exp.runs.values())).items():  # the same for every policy
            for r in s.get("users_rounded", ()):
                con.print(f"[yellow]note:[/] at load {ld:g}x, {r['source']} ran {r['users']} users: {r['factor']:.3g}x")
        if spec.get("drills"):
            con.print(report.drill_timeline(exp.runs))
        meta = {"fleet": str(fleet), "workload": str(workload or trace), "seed": exp.used_seed, "loads": loads,
                "policies": list(policy), "wall_s": time.perf_counter() - t0}
        path = report.write_results(out, meta, exp.runs)
        con.print(f"wrote {path}")
        if plots:
            for p in report.plot(out, exp.runs, exp.samples):
                con.print(f"wrote {p}")


def _message(e: Exception) -> str:
    """The error's text (a KeyError's str() is its message in quotes), escaped for rich's markup: a value in it
    such as ``[/]`` (a spec's slo, a path) crashed the print with a MarkupError, and ``[min, max]`` vanished."""
    from rich.markup import escape

    return escape(str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e))
