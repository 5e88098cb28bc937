"""``hbench calibrate``: fit the simulator's rates to a real engine.

Times the engine over the calibration design (`adapters.calibration.design`),
fits per-step and per-request overhead, effective bandwidths and GEMM /
attention / scan throughput by least squares (`adapters.calibration.fit`),
prints the residuals per shape class next to the datasheet preset's, and
writes a profile that ``hbench run --gpu profile.json`` accepts. A fit whose
median error on the held-out cells exceeds ``--max-error`` is refused: exit 1,
no profile written.
"""

from __future__ import annotations

import math

import click

from adapters.calibration import DRIVERS
from harness.config import ORG_NAMES
from hbench.calibration import MAX_HELD_OUT_ERROR
from hbench.flag_types import INT, Float, Int


def _pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


def print_fit(fit, profile) -> None:
    """Coefficients with their intervals, then residuals per class: profile vs datasheet."""
    click.echo(f"profile {profile.name}: {fit.samples} samples, {fit.dropped} outliers dropped")
    click.echo(f"  {'coefficient':<20}{'value':>12}  {'95% interval':<25} resolved  rate")
    r = profile.rates
    for name, c in fit.coefficients.items():
        lo, hi = c["ci95"]
        rate = getattr(r, name)
        shown = (f"{rate * 1e3:.3f} ms" if name.endswith("overhead_s")
                 else f"{rate:.3g}/s" if c["value"] > 0 else "not measurable")
        click.echo(f"  {name:<20}{c['value']:>12.3g}  [{lo:.3g}, {hi:.3g}]".ljust(59)
                   + f"{'yes' if c['resolved'] else 'no':<10}{shown}")
    click.echo(f"\n  median |relative error| per shape class (profile vs datasheet "
               f"{fit.baseline.get('name', '-')}):")
    click.echo(f"  {'set':<10}{'class':<10}{'n':>5}{'profile':>10}{'p90':>9}{'datasheet':>11}")
    for part in ("train", "held_out"):
        for cls, e in fit.residuals.get(part, {}).items():
            d = fit.baseline.get(part, {}).get(cls, {})
            click.echo(f"  {part:<10}{cls:<10}{e['n']:>5}{_pct(e['median_abs_rel_error']):>10}"
                       f"{_pct(e['p90_abs_rel_error']):>9}"
                       f"{_pct(d.get('median_abs_rel_error')):>11}")


@click.command(context_settings={"max_content_width": 100})
@click.option("--engine", type=click.Choice(sorted(DRIVERS)), default="torch", show_default=True,
              help="torch: the in-process engine, which times its own steps; vllm: a launched "
                   "vLLM server timed from outside (ITL and TTFT).")
@click.option("--model", "model_dir", required=True, type=click.Path(),
              help="Model directory (hbench tiny-model, or a Falcon-H1 checkpoint).")
@click.option("--org", type=click.Choice(ORG_NAMES, case_sensitive=False), default="s2", show_default=True,
              help="Organization the engine serves with while measured.")
@click.option("--device", default="cpu", show_default=True, help="torch engine: cpu or cuda[:N].")
@click.option("--dtype", default="auto", show_default=True,
              help="torch engine: auto (cpu fp32, cuda bf16), fp32 or bf16.")
@click.option("--quick", is_flag=True, help="A small design (tests, CI): fewer cells, shorter.")
@click.option("--repeats", default=3, show_default=True, type=Int(1, 20),
              help="Passes over the design (cells shuffled each pass); each sample keeps "
                   "its fastest time.")
@click.option("--max-model-len", default=4096, show_default=True, type=Int(256),
              help="Longest context the design uses.")
@click.option("--max-error", default=MAX_HELD_OUT_ERROR, show_default=True,
              type=Float(0, lo_open=True),
              help="Refuse a fit whose median |relative error| on held-out cells is larger.")
@click.option("--against", default="a100-pcie-40gb", show_default=True,
              help="Datasheet preset whose errors are shown beside the profile's.")
@click.option("--samples", "samples_path", type=click.Path(), default=None,
              help="Also write the measured samples as CSV.")
@click.option("--seed", type=INT, default=0, show_default=True)
@click.option("-o", "--out", "out_path", required=True, type=click.Path(),
              help="Where to write the profile (JSON).")
@click.pass_context
def calibrate(ctx, engine, model_dir, org, device, dtype, quick, repeats, max_model_len, max_error,
              against, samples_path, seed, out_path):
    """Measure ENGINE's step times and fit the simulator's cost profile to them.

    \b
    hbench tiny-model --preset proportional -o /tmp/prop
    hbench calibrate --engine torch --model /tmp/prop -o torch-cpu.json
    hbench run --engine sim --config /tmp/prop/config.json --gpu torch-cpu.json ...
    """
    from adapters.sim.profile import save_profile
    from harness.config import RunConfig
    from hbench.calibration import calibrate_model, check_held_out, write_samples
    from hbench.flag_rules import TOOL_RULES, check_flags, typed_flags
    from hbench.paths import check_writable_file
    from hbench.progress import progress_bar

    check_flags(typed_flags(ctx), [RunConfig(engine=engine)], TOOL_RULES)
    check_writable_file(out_path, "--out")
    if samples_path:
        check_writable_file(samples_path, "--samples")
    options = {"device": device, "dtype": dtype} if engine == "torch" else {}
    with progress_bar() as update:
        profile, fit, samples = calibrate_model(
            engine, model_dir, org=org, against=against, quick=quick,
            max_model_len=max_model_len, seed=seed, repeats=repeats,
            progress=lambda cell: update(cell.name), **options)
    if samples_path:
        write_samples(samples, samples_path)
    print_fit(fit, profile)
    check_held_out(fit, max_error)
    save_profile(profile, out_path)
    click.echo(f"\nheld-out error {_pct(fit.held_out_error)} (datasheet "
               f"{_pct(fit.baseline.get('held_out', {}).get('all', {}).get('median_abs_rel_error'))})"
               f"; wrote {out_path}")
