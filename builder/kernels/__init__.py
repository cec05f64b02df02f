"""The kernel stage: each FlashInfer module compiled once, shared, and shipped as a wheel.

- `jit_list`: the target's module list against its launch profiles;
- `build`: reuse or compile every module in a container of the kernel-builder stage;
- `cache`: entries by key, in the local cache and a shared registry;
- `trust`: the site's signing keys for registry entries;
- `wheel`: the kernel wheel FlashInfer loads its modules from;
- `packs`: modules a server compiled at start-up, harvested for the next image.
"""
