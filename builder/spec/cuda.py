"""Facts about CUDA architectures that hold for every target."""

from packaging.version import Version

# The oldest CUDA toolkit whose nvcc can generate code for each compute capability.
MIN_CUDA_FOR_ARCH: dict[str, Version] = {
    "8.0": Version("11.0"),
    "8.6": Version("11.1"),
    "8.9": Version("11.8"),
    "9.0": Version("11.8"),
    "10.0": Version("12.8"),
    "12.0": Version("12.8"),
}


def arch_base(arch: str) -> str:
    """`12.0a` -> `12.0` (the family/feature suffix does not change the toolkit minimum)."""
    return arch.rstrip("af")


def sm_name(arch: str) -> str:
    """`12.0a` -> `sm_120a`, as nvcc and cuobjdump spell it."""
    return "sm_" + arch.replace(".", "")
