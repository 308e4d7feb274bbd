"""Refuse what this GPU cannot measure honestly: no CUDA GPU, or a format its tensor cores lack."""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.errors import SetupError, UnsupportedError
from advisor.formats import Format

if TYPE_CHECKING:
    import torch


def require_gpu() -> torch.device:
    import torch

    if not torch.cuda.is_available():
        raise SetupError("the runtime needs a CUDA GPU; none is visible to PyTorch (use --energy predicted)")
    return torch.device("cuda")


def check_formats_supported(formats: set[Format], device: torch.device | None = None) -> None:
    """Refuse formats this GPU cannot run on its tensor cores, with the reason."""
    import torch

    if Format.NVFP4 in formats:
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        if major < 10:
            raise UnsupportedError(
                f"NVFP4 energy cannot be measured on {name} (sm_{major}{minor}): Hopper and older "
                "GPUs have no FP4 tensor cores, so any NVFP4 run there is an emulation whose energy "
                "says nothing about a Blackwell deployment. NVFP4 accuracy is still available "
                "(fake quantization); for energy use --energy predicted with a Blackwell profile."
            )
        raise UnsupportedError(
            f"the NVFP4 GEMM path of this runtime is not verified on {name}; no Blackwell GPU was "
            "available to test it, so it refuses rather than report unverified numbers"
        )
    if Format.FP8 in formats:
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise UnsupportedError(
                f"FP8 GEMMs need sm_89 or newer; {torch.cuda.get_device_name(device)} is sm_{major}{minor}"
            )
