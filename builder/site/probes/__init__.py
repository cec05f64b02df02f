"""Scripts that run where builder is not installed: inside the server image (`builder doctor
--p2p` bind-mounts them read-only) or on a bare GPU host. Each is one file that imports only
the standard library at the top, and what it measures (torch, NCCL, FlashInfer) lazily."""
