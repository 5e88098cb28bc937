"""``hbench hardware``: the simulator's accelerator presets and cost constants.

Prints every number the roofline cost model uses that is not derived from the
model geometry, each with where it comes from (datasheet, model config, or an
assumption), so a simulated result can always be traced to its inputs.
"""

from __future__ import annotations

import json

import click

from adapters.sim.cost import DEFAULTS, CostModel
from adapters.sim.hardware import GIB, HARDWARE, get_hardware
from harness.engine.shape import StepShape
from harness.model_configs import preset

# Reference steps shown with --model: what one decode and one long prefill cost.
PROBES = {
    "decode x1 @100": StepShape.from_requests(decode_contexts=(100,)),
    "decode x63 @3332": StepShape.from_requests(decode_contexts=(3332,) * 63),
    "prefill 4096": StepShape.from_requests(prefill_chunks=((4096, 0),)),
}


def _preset_dict(h) -> dict:
    return {
        "name": h.name,
        "mem_bw_bytes_s": h.mem_bw_bytes_s,
        "dense_flops_s": h.dense_flops_s,
        "mem_bytes": h.mem_bytes,
        "ridge_flops_per_byte": h.ridge_flops_per_byte,
        "provenance": h.provenance,
    }


@click.command()
@click.argument("name", required=False)
@click.option(
    "--model",
    default=None,
    help="Also show reference step times of this model preset (e.g. falcon-h1-7b).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def hardware(name, model, as_json):
    """List accelerator presets (or just NAME) and the cost model's constants."""
    presets = [get_hardware(name)] if name else [HARDWARE[k] for k in sorted(HARDWARE)]
    constants = DEFAULTS.provenance()
    probes = _probe_times(preset(model), presets) if model else None
    if as_json:
        out = {
            "hardware": [_preset_dict(h) for h in presets],
            "cost_constants": {k: {"value": v, "provenance": p} for k, (v, p) in constants.items()},
        }
        if probes is not None:
            out["model"] = model
            out["step_times"] = probes
        click.echo(json.dumps(out, indent=2))
        return

    click.echo(f"{'preset':<16}{'HBM GB/s':>10}{'bf16 TFLOP/s':>14}{'memory GiB':>12}{'ridge FLOP/B':>14}")
    for h in presets:
        click.echo(
            f"{h.name:<16}{h.mem_bw_bytes_s / 1e9:>10,.0f}{h.dense_flops_s / 1e12:>14,.0f}"
            f"{h.mem_bytes / GIB:>12,.0f}{h.ridge_flops_per_byte:>14,.1f}"
        )
    click.echo("\nprovenance:")
    for h in presets:
        click.echo(f"  {h.name}: {h.provenance}")
    click.echo("\ncost constants (adapters/sim/cost.py CostConstants):")
    for k, (v, p) in constants.items():
        click.echo(f"  {k} = {v}\n      {p}")
    if probes is not None:
        click.echo(f"\nreference steps, {model} (ms, bound):")
        click.echo(f"  {'preset':<16}" + "".join(f"{p:>24}" for p in PROBES))
        for h in presets:
            cells = "".join(
                f"{probes[h.name][p]['total_s'] * 1e3:>16.2f} {probes[h.name][p]['bound']:>7}"
                for p in PROBES
            )
            click.echo(f"  {h.name:<16}{cells}")


def _probe_times(geom, presets) -> dict:
    """preset -> probe -> {total_s, bound} under the default constants."""
    out = {}
    for h in presets:
        model = CostModel(geom, h)
        out[h.name] = {}
        for label, shape in PROBES.items():
            c = model.step(shape)
            out[h.name][label] = {"total_s": c.total_s, "bound": c.bound}
    return out
