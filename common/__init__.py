"""The floor every hbench package stands on.

It holds only what all floors must agree on (the user-facing error type,
`common.errors.HbenchError`) and imports no other hbench package, so the
workloads, the harness core, the engines, the analysis and the shell may all
import it without an import running back up.
"""
