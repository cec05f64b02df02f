"""The build host's subcommands: build, lock, publish."""
