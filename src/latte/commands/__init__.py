"""Subcommands of the `latte` CLI; each module has `register(subparsers)`."""
