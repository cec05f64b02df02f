"""The subcommands, grouped by what they are for."""
