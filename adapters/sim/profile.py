"""A measured cost profile: the simulator's rates fitted to a real engine.

``hbench calibrate`` times a real engine over designed step shapes and fits
the cost model's physically meaningful constants (`adapters.sim.cost.Rates`:
per-step and per-request overhead, effective bandwidths, GEMM / attention /
scan throughput) to the measured times. The result is a JSON file that
``hbench run --gpu profile.json`` accepts wherever a datasheet preset name
goes, so a measured machine replaces the datasheet's assumptions::

    {"kind": "hbench-cost-profile", "schema": 1, "name": ..., "engine": "torch",
     "device": "cpu", "model": "<geometry the shapes were measured with>",
     "mem_bytes": <device memory or null>, "rates": {<Rates fields>},
     "fit": {<residuals per shape class, held-out errors, the design>},
     "provenance": "<command, host, versions, date>"}

Only ``rates`` and ``mem_bytes`` change what the simulator computes; the rest
is the profile's record of where its numbers came from. The manifest of a run
that used a profile holds the profile's sha256 and rates (`describe`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from adapters.sim.cost import Rates
from adapters.sim.hardware import MAX_DEVICE_BYTES, Hardware, get_hardware
from common.atomic import atomic_write_text
from common.errors import HbenchError
from common.input_files import read_input_bytes
from common.safe_json import loads_json
from harness.config import is_profile_path

PROFILE_KIND = "hbench-cost-profile"
PROFILE_SCHEMA = 1
#: A profile is a few kilobytes; a larger file is not one.
MAX_PROFILE_BYTES = 16 * 2**20


@dataclass(frozen=True)
class CostProfile:
    """Fitted rates of one engine on one device (see the module docstring)."""

    name: str
    rates: Rates
    engine: str
    device: str
    model: str
    mem_bytes: int | None = None       # device memory (None: unknown, not checked)
    fit: dict = field(default_factory=dict)
    provenance: str = ""
    sha256: str = ""                   # of the file it was read from ("" if not read)

    def to_dict(self) -> dict:
        return {"kind": PROFILE_KIND, "schema": PROFILE_SCHEMA, "name": self.name,
                "engine": self.engine, "device": self.device, "model": self.model,
                "mem_bytes": self.mem_bytes, "rates": asdict(self.rates), "fit": self.fit,
                "provenance": self.provenance}

    def describe(self) -> dict:
        """What a run's manifest records of the profile it was simulated with."""
        return {"name": self.name, "sha256": self.sha256, "engine": self.engine,
                "device": self.device, "model": self.model, "rates": asdict(self.rates)}


def save_profile(profile: CostProfile, path: str | Path) -> Path:
    """Write ``profile`` as JSON, atomically (a half-written profile never exists)."""
    return atomic_write_text(Path(path), json.dumps(profile.to_dict(), indent=2, sort_keys=False) + "\n")


def load_profile(path: str | Path) -> CostProfile:
    """Read a profile; HbenchError naming the file for anything malformed."""
    path = Path(path)
    blob = read_input_bytes(path, "cost profile", MAX_PROFILE_BYTES)
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise HbenchError(f"cost profile {path}: not UTF-8 text") from None
    d = loads_json(text, f"cost profile {path}")
    if not isinstance(d, dict) or d.get("kind") != PROFILE_KIND:
        raise HbenchError(f"cost profile {path}: not an hbench cost profile "
                          f"(expected \"kind\": \"{PROFILE_KIND}\"; make one with hbench calibrate)")
    if d.get("schema") != PROFILE_SCHEMA:
        raise HbenchError(f"cost profile {path}: schema {d.get('schema')!r}, this hbench reads "
                          f"{PROFILE_SCHEMA}")
    rates = d.get("rates")
    names = {f.name for f in fields(Rates)}
    if not isinstance(rates, dict) or set(rates) - names:
        raise HbenchError(f"cost profile {path}: \"rates\" must be an object with keys from "
                          f"{', '.join(sorted(names))}")
    try:
        r = Rates(**rates)
    except TypeError as exc:
        raise HbenchError(f"cost profile {path}: rates: {exc}") from None
    except HbenchError as exc:
        raise HbenchError(f"cost profile {path}: {exc}") from None
    mem = d.get("mem_bytes")
    if mem is not None and not (isinstance(mem, int) and not isinstance(mem, bool)
                                and 0 < mem <= MAX_DEVICE_BYTES):
        raise HbenchError(f"cost profile {path}: mem_bytes must be a positive integer "
                          f"(at most {MAX_DEVICE_BYTES:,}) or null")
    return CostProfile(name=str(d.get("name") or path.stem), rates=r,
                       engine=str(d.get("engine", "")), device=str(d.get("device", "")),
                       model=str(d.get("model", "")), mem_bytes=mem, fit=d.get("fit") or {},
                       provenance=str(d.get("provenance", "")),
                       sha256=hashlib.sha256(blob).hexdigest())


def hardware_for(spec: str) -> Hardware | CostProfile:
    """The preset or the measured profile ``--gpu`` names."""
    return load_profile(spec) if is_profile_path(spec) else get_hardware(spec)


def check_gpu_memory(setup) -> None:
    """Refuse (HbenchError, one line) a simulated run whose model weights plus
    its budget's whole-model state bytes exceed the memory of the GPU
    ``--gpu`` names (a preset's, or a profile's measured device's; a GPU of
    unknown memory holds anything). ``--allow-oversubscribe`` skips this."""
    config, geom, budget = setup.config, setup.geometry, setup.budget
    hw = hardware_for(config.gpu)
    need = geom.weights_bytes + budget.whole_model_bytes
    if hw.mem_bytes is not None and need > hw.mem_bytes:
        raise HbenchError(
            f"weights ({geom.weights_bytes / 2**30:.1f} GiB) plus budget {config.budget} "
            f"({budget.whole_model_bytes / 2**30:.1f} GiB of state) need "
            f"{need / 2**30:.1f} GiB, more than the {hw.mem_bytes / 2**30:.0f} GiB of "
            f"{config.gpu}; choose a smaller budget or a larger --gpu, or pass "
            "--allow-oversubscribe")
