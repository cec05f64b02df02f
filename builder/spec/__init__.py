"""What the build host and the GPU VM agree on: the target, its launch profiles, the recipe
and manifest an image carries, the lock format and the JIT module list."""
