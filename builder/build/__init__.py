"""The build host: sources -> patches -> wheels -> image, the lock, the kernels, publishing.
Needs the `build` extra (pygit2, build, uv, cryptography...)."""
