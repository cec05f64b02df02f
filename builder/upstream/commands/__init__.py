"""The upstream and patches subcommands."""
