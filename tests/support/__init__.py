"""What the test suite shares, one module a concern, so no helper is written twice.

- `cli`: invoking ``hbench`` in process and reading its one-line errors.
- `compare`: equality of result values with NaN equal to NaN.
- `floats`, `attention`, `mamba`: float32 rounding bounds for comparing values
  computed two ways (why a bound and not a number: `floats`).
- `results_factory`: synthetic run directories in the results format.
- `records`: synthetic request records, as the engine loop hands them on.
- `orgs`: an organization driven by hand through its protocol (serve a prompt).
- `scripted_server`, `fake_openai_cache`: local servers for the served-engine clients.
- `served`: the `RunSetup` and vLLM adapter a served-engine test hands in.
- `engines`: the real engines' venvs (skip markers) and the tiny models vLLM loads.
- `sim_pair`: the simulator's two paths, run side by side.
- `hostile`, `import_probe`, `waiting`: refusals, import checks, bounded waits.
- `budget`: the suite's wall-time budget per tier (a pytest plugin).
"""

from pathlib import Path

#: The checkout's root: tests find the repository's scripts, baselines and fixtures from it.
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Hand-written model configs and recorded engine output.
FIXTURES = REPO_ROOT / "tests" / "fixtures"
