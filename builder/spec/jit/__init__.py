"""The FlashInfer JIT modules: the target's list against its launch profiles (`jit_list`),
and kernel packs harvested from servers for the next image (`packs`)."""
