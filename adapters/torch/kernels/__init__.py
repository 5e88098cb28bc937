"""Triton kernels that read recurrent state through page tables (the decode path).

    tables.py       per-request page tables and the address rule (plain torch)
    addressing.py   that rule inside a kernel (`triton.jit` helpers)
    ssm_update.py   Mamba-2's one-token state update: paged, dense, torch reference
    conv_update.py  the causal conv's one-token update: paged, dense, torch reference

Importing a kernel module needs the ``triton`` package; `tables` does not.
With ``TRITON_INTERPRET=1`` (set before the first import) the kernels run on
CPU tensors through Triton's interpreter, which is how CI tests them.
"""
