"""What one engine step computes, in the handful of sums that price it.

A planned step (`harness.scheduler.batch.StepBatch`) becomes a `StepShape`:
the sums over its batch that decide its cost, and nothing else. It lives in
the engine core, not in the cost model, because it describes a batch: the
simulator prices it (`adapters.sim.cost.CostModel.step`), the torch engine
records it beside each measured step and calibration fits rates to it.
`StepShape.of_step` is the one definition of a step's shape; `of_batch`
and `from_requests` only gather its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepShape:
    """Aggregate description of one engine step.

    All counts are sums over the step's batch; `of_step` shows the definition
    of each in code. A step must do something: compute at least one token or
    move at least one checkpoint.
    """

    prefill_tokens: int  # new prompt tokens computed this step (all prefill chunks)
    prefill_attn_pairs: float  # sum over chunks: new * (context_before + (new + 1) / 2)
    decode_requests: int  # requests generating one token this step
    decode_context_tokens: int  # sum over decodes of their current context length
    prefill_context_tokens: int  # sum over chunks of context_before (KV of the prefix read)
    state_requests: int  # requests whose SSM + conv state is read and written
    checkpoint_copies: int  # checkpoints published (copied) this step
    checkpoint_loads: int = 0  # checkpoints gathered/adopted into a live state

    def __post_init__(self) -> None:
        if (
            self.prefill_tokens < 0
            or self.prefill_attn_pairs < 0
            or self.decode_requests < 0
            or self.decode_context_tokens < 0
            or self.prefill_context_tokens < 0
            or self.state_requests < 0
            or self.checkpoint_copies < 0
            or self.checkpoint_loads < 0
        ):
            raise ValueError(f"StepShape counts must be non-negative: {self}")
        if self.prefill_tokens == 0:
            if self.prefill_attn_pairs or self.prefill_context_tokens:
                raise ValueError(f"StepShape has prefill pairs/context but no prefill tokens: {self}")
            if not (self.decode_requests or self.checkpoint_copies or self.checkpoint_loads):
                raise ValueError(f"empty StepShape: nothing to compute or copy: {self}")
        elif self.prefill_attn_pairs < self.prefill_tokens:
            # every new token attends at least to itself
            raise ValueError(
                f"StepShape prefill_attn_pairs {self.prefill_attn_pairs} < "
                f"prefill_tokens {self.prefill_tokens}"
            )

    @classmethod
    def of_chunks(cls, prefill_chunks, decode_requests: int, decode_context_tokens: int,
                  checkpoint_copies: int = 0, checkpoint_loads: int = 0) -> StepShape:
        """The shape of a step computing the prefill chunks ``prefill_chunks``,
        ``(new_tokens, context_before)`` each in batch order, and
        ``decode_requests`` decodes whose contexts sum to
        ``decode_context_tokens``: the one definition of every sum."""
        return cls(
            prefill_tokens=sum(n for n, _ in prefill_chunks),
            prefill_attn_pairs=sum(n * (c + (n + 1) / 2) for n, c in prefill_chunks),
            decode_requests=decode_requests,
            decode_context_tokens=decode_context_tokens,
            prefill_context_tokens=sum(c for _, c in prefill_chunks),
            state_requests=len(prefill_chunks) + decode_requests,
            checkpoint_copies=checkpoint_copies,
            checkpoint_loads=checkpoint_loads,
        )

    @classmethod
    def from_requests(
        cls,
        prefill_chunks: tuple[tuple[int, int], ...] = (),
        decode_contexts: tuple[int, ...] = (),
        checkpoint_copies: int = 0,
        checkpoint_loads: int = 0,
    ) -> StepShape:
        """`of_chunks` from per-request pieces: ``decode_contexts`` holds the
        context length of each decoding request."""
        return cls.of_chunks(prefill_chunks, len(decode_contexts), sum(decode_contexts),
                             checkpoint_copies, checkpoint_loads)

    @classmethod
    def of_step(cls, prefill_items, decode_requests: int, decode_context_tokens: int) -> StepShape:
        """The shape of a step computing the prefill items ``prefill_items``
        (`harness.scheduler.batch.BatchItem`s, batch order) and
        ``decode_requests`` decodes whose contexts sum to
        ``decode_context_tokens``: a chunk is (new tokens, start), a checkpoint
        copy per grid boundary a chunk crosses below the prompt's publish
        limit, a load per adopted checkpoint. Every engine that times steps
        describes them so."""
        chunks, copies, loads = [], 0, 0
        for it in prefill_items:
            chunks.append((it.end - it.start, it.start))
            loads += it.adopted
            grid = it.grid
            copies += min(it.end, it.req.prefill_until) // grid - it.start // grid
        return cls.of_chunks(chunks, decode_requests, decode_context_tokens, copies, loads)

    @classmethod
    def of_batch(cls, batch) -> StepShape:
        """The shape of a planned `harness.scheduler.batch.StepBatch` (`of_step`
        of its prefill items and its decodes)."""
        chunks, decodes, context = [], 0, 0
        for it in batch.items:
            if it.prefill:
                chunks.append(it)
            else:
                decodes += 1
                context += it.start
        return cls.of_step(chunks, decodes, context)
