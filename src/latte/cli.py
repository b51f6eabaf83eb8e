"""The `latte` command line.

Each feature module contributes its subcommands through `register(subparsers)`;
heavy imports (torch, onnxruntime, tritonclient) happen inside the handlers so that
`latte --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

# Modules that add subcommands, in the order `latte --help` lists them.
COMMAND_MODULES = [
    "latte.commands.serving",
    "latte.commands.passthrough",
    "latte.commands.deploy",
    "latte.commands.generator",
    "latte.commands.bench",
    "latte.commands.watch",
]


class CommandListFormatter(argparse.HelpFormatter):
    """Keeps each command's help on the command's own line.

    argparse sizes the name column without the extra indent of subcommands, so
    longer names (install-backend) would push their help onto the next line.
    """

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30, width=100)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction) and action.choices:
            longest = max(len(name) for name in action.choices)
            self._action_max_length = max(self._action_max_length, longest + self._current_indent + 4)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latte",
        formatter_class=CommandListFormatter,
        description="Latte: a Triton backend with a buddy-allocator arena and a locality-aware "
        "scheduler, plus a generator for Triton model repositories.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and the native build's features")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for command in sub.choices.values():
        # Every option's default shows in its --help line.
        if command.formatter_class is argparse.HelpFormatter:
            command.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    return parser


def parse_command_line(argv: List[str]):
    """(parser, args); what follows `--` goes to the program a command starts, as
    args.passthrough (`latte serve REPO -- --log-verbose=1`)."""
    rest: List[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    if rest and not hasattr(args, "passthrough"):
        parser.error(f"`latte {args.command or ''}` takes no arguments after `--` (got {' '.join(rest)})")
    if hasattr(args, "passthrough"):
        args.passthrough = rest
    return parser, args


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from latte.commands import passthrough

    if argv and argv[0] in passthrough.PASS_THROUGH:
        return passthrough.run(argv[0], argv[1:])
    parser, args = parse_command_line(argv)
    if args.version:
        from latte import __version__
        from latte import _native

        info = _native.build_info()
        print(f"latte {__version__} (native core {info['version']}, {info['compiler']}, "
              f"cuda={'yes' if info['cuda'] else 'no'}, debug_checks={'yes' if info['debug_checks'] else 'no'})")
        return 0
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the CLI's last line of defence: one clear line, no traceback
        if getattr(args, "debug", False):
            raise
        print(f"latte {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
