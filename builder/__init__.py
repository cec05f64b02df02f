"""builder: pinned upstream sources + a patch series -> patched wheels and a CUDA image."""

__version__ = "0.1.0"
