"""A run's checkpoint policies, as one frozen value an organization is built with.

Where checkpoints are published (`harness.orgs.publish_policy`) and which
cached checkpoint is evicted (`harness.orgs.evict_policy`) are an axis of
their own, orthogonal to the organization: every organization takes them.
`CheckpointPolicy` names them (``--ckpt-publish``, ``--ckpt-every-k``,
``--ckpt-evict``, ``--utility-alpha``) and carries the one thing the
geometry decides, the FLOPs a prefix of J tokens costs; the organization
builds its own policy objects from it (`publish_policy`, `evict_policy`),
so two organizations never share a policy's state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.orgs.alpha_tuning import INITIAL_ALPHA, AlphaTuner
from harness.orgs.evict_policy import Utility
from harness.orgs.publish_policy import PublishPolicy, publish_policy_for

#: ``--utility-alpha auto``
AUTO = "auto"


@dataclass(frozen=True)
class CheckpointPolicy:
    publish: str = "every"
    every_k: int = 2
    evict: str = "lru"
    #: the utility eviction's alpha, or ``"auto"``: tuned online as Marconi
    #: tunes it (`harness.orgs.alpha_tuning`)
    alpha: float | str = 1.0
    #: FLOPs of prefilling a prefix of J tokens (`harness.prefix_flops`); the
    #: utility eviction needs it
    flops: Callable[[int], float] | None = field(default=None, compare=False)

    @classmethod
    def from_config(cls, config, geometry) -> CheckpointPolicy:
        """The policies a `RunConfig` names, with ``geometry``'s prefix FLOPs."""
        from harness.prefix_flops import prefix_flops

        return cls(publish=config.ckpt_publish, every_k=config.ckpt_every_k,
                   evict=config.ckpt_evict, alpha=config.utility_alpha,
                   flops=lambda j: prefix_flops(geometry, j))

    @property
    def is_default(self) -> bool:
        """The study's policies: publish at every boundary, evict by LRU."""
        return self.publish == "every" and self.evict == "lru"

    def publish_policy(self) -> PublishPolicy | None:
        """A fresh publish policy; None for ``every`` (the study's `Spares` as is)."""
        return None if self.publish == "every" else publish_policy_for(self.publish, self.every_k)

    def evict_policy(self):
        """A fresh eviction policy; None for ``lru`` (the entry table's own LRU)."""
        if self.evict == "lru":
            return None
        if self.evict == "utility":
            if self.flops is None:
                raise ValueError("utility eviction needs the prefix FLOPs (CheckpointPolicy.flops)")
            if self.alpha == AUTO:
                return Utility(INITIAL_ALPHA, self.flops, AlphaTuner(self.flops))
            return Utility(self.alpha, self.flops)
        raise ValueError(f"unknown eviction policy {self.evict!r}")


DEFAULT_POLICY = CheckpointPolicy()
