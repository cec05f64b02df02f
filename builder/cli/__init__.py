"""The `builder` command: every package's subcommands assembled, errors turned into exit codes,
help and shell completion. Nothing imports cli/."""
