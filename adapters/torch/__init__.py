"""A Falcon-H1 forward pass in PyTorch for an in-process paged serving engine.

The model never owns request state. Attention K/V live in page tensors the
caller allocates and reads through block tables; SSM and conv states are
tensors the caller gathers from its pages and scatters back
(`adapters.torch.paging`). The pieces, one idea each:

    config.py     config.json -> a frozen `FalconH1Config` (every muP multiplier)
    layers.py     RMSNorm, gated RMSNorm, rotary embedding, SwiGLU MLP
    attention.py  attention over K/V blocks with an online softmax
    mamba.py      the Mamba-2 mixer: causal conv with carried state, chunked
                  SSD scan for prefill, one-step recurrence for decode
    paging.py     page tensors, block tables, checkpoint placement over pages
    model.py      weights from model.safetensors; prefill_chunk / decode

The serving engine on top (``hbench run --engine torch``):

    pools.py          one preallocated tensor per pool of the organization's capacity
    tracking.py       the organization as the engine drives it: copies, poisoning
    executor.py       one step of a StepBatch over paged state
    engine.py         the open-loop wall-clock loop, step rows and counters
    continuation.py   ``hbench verify --engine torch``: against a cold run

The model computes in the dtype and on the device of its weights (float32 on
CPU; `FalconH1.to` moves it). torch is imported only by this package (the
``engines`` extra) and by the application where it drives this engine
(`hbench.calibration`, `hbench.device_check`).
"""
