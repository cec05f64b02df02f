"""The GPU VM's subcommands: serve (launch, deploy-files, wait-ready), check (verify, doctor),
qualify, jit."""
