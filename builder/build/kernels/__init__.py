"""The kernel stage: each FlashInfer module compiled once, shared, and shipped as a wheel.

- `build`: reuse or compile every module in a container of the kernel-builder stage;
- `cache`: entries by key, in the local cache and a shared registry;
- `trust`: the site's signing keys for registry entries;
- `wheel`: the kernel wheel FlashInfer loads its modules from.

The module list and the harvested packs, which a GPU VM reads too: builder/spec/jit/.
"""
