"""Accelerator presets for the simulator's roofline cost model.

A preset holds only datasheet peaks: HBM bandwidth, dense bf16 tensor-core
FLOP/s and device memory. What fraction of those peaks a real serving step
achieves is not a property of the chip alone, so it lives in
`adapters.sim.cost.CostConstants`, never here. Each preset carries its
provenance so that ``hbench hardware`` can show where every number came from.

Memory capacities are the datasheet's "GB" figures read as GiB: HBM stacks come
in binary sizes (an A100 40GB is five 8 GiB HBM2 stacks), and the driver
reports slightly less than this after ECC and its own reservation.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import HbenchError
from common.numbers import check_physical

GIB = 1 << 30
#: Largest device memory believed (1 EiB): a bigger one is a corrupted value.
MAX_DEVICE_BYTES = 1 << 60


@dataclass(frozen=True)
class Hardware:
    """Datasheet peaks of one accelerator (one device, no tensor parallelism)."""

    name: str
    mem_bw_bytes_s: float  # HBM bandwidth (datasheet)
    dense_flops_s: float  # dense bf16 tensor-core FLOP/s, no structured sparsity (datasheet)
    mem_bytes: int  # device memory (datasheet, GiB)
    provenance: str  # where the numbers come from

    def __post_init__(self) -> None:
        if self.mem_bw_bytes_s <= 0 or self.dense_flops_s <= 0 or self.mem_bytes <= 0:
            raise HbenchError(f"hardware {self.name!r}: peaks and memory must be positive")
        check_physical(self.mem_bw_bytes_s, f"hardware {self.name!r}: mem_bw_bytes_s", 1.0, 1e21)
        check_physical(self.dense_flops_s, f"hardware {self.name!r}: dense_flops_s", 1.0, 1e21)
        check_physical(self.mem_bytes, f"hardware {self.name!r}: mem_bytes", 1, MAX_DEVICE_BYTES)

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns from memory to compute."""
        return self.dense_flops_s / self.mem_bw_bytes_s


HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in (
        Hardware(
            name="a100-pcie-40gb",
            mem_bw_bytes_s=1555e9,
            dense_flops_s=312e12,
            mem_bytes=40 * GIB,
            provenance="NVIDIA A100 Tensor Core GPU datasheet, A100 40GB PCIe column: "
            "1,555 GB/s HBM2, 312 TFLOPS BF16 tensor (624 with sparsity), 40 GB",
        ),
        Hardware(
            name="h100-sxm",
            mem_bw_bytes_s=3.35e12,
            dense_flops_s=989e12,
            mem_bytes=80 * GIB,
            provenance="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: "
            "3.35 TB/s HBM3, 1,979 TFLOPS BF16 with sparsity = 989 dense, 80 GB",
        ),
        Hardware(
            name="h200",
            mem_bw_bytes_s=4.8e12,
            dense_flops_s=989e12,
            mem_bytes=141 * GIB,
            provenance="NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: "
            "4.8 TB/s HBM3e, 1,979 TFLOPS BF16 with sparsity = 989 dense, 141 GB",
        ),
    )
}


def get_hardware(name: str) -> Hardware:
    """The preset called ``name`` (case-insensitive); HbenchError lists the choices."""
    key = name.lower()
    if key not in HARDWARE:
        raise HbenchError(f"unknown hardware {name!r}; choose from {', '.join(sorted(HARDWARE))}")
    return HARDWARE[key]
