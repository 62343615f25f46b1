"""Command line: ``python -m hpccoll info``, ``mpiexec -n N python -m hpccoll bench`` and ``... tune``.

Run it under ``python -m mpi4py -m hpccoll ...`` (or through the ``hpccoll``
console script) to have an error on one rank abort the whole job.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from . import __version__, _bench, _info, _tune

__all__ = ["main", "parser"]


def parser(prog: str = "python -m hpccoll") -> argparse.ArgumentParser:
    """The command line: ``--version`` and the ``info``, ``bench`` and ``tune`` subcommands.

    Parameters
    ----------
    prog : str
        The program name shown in usage lines.

    Returns
    -------
    argparse.ArgumentParser
        Parsing a command line gives a namespace whose ``run(args, parser, shown)``
        runs the subcommand (``None`` when no subcommand was named).
    """
    p = argparse.ArgumentParser(
        prog=prog,
        description="hpccoll's command line: a report of this installation, and an nccl-tests style benchmark.",
        epilog=(
            "Launch under MPI for more than one rank, e.g.\n"
            "  mpiexec -n 2 python -m mpi4py -m hpccoll bench -b 8 -e 64M -f 4 --baseline\n"
            f"'{prog} COMMAND -h' lists a command's options."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"hpccoll {__version__}")
    p.set_defaults(run=None, subparser=None)
    sub = p.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    info = sub.add_parser(
        "info",
        help="MPI, GPU and transport report (printed once, by rank 0)",
        description=_info.__doc__,
    )
    bench = sub.add_parser(
        "bench",
        help="nccl-tests style bandwidth table of every collective",
        description=_bench.__doc__,
        epilog=_bench.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tune = sub.add_parser(
        "tune",
        help="measure the transports and MPI's call forms here; write the profile auto and plans use",
        description=_tune.__doc__,
        epilog="Run it under mpiexec with the job's rank count and node layout, once per allocation, e.g.\n"
        "  mpiexec -n 4 python -m mpi4py -m hpccoll tune",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for command, module in ((info, _info), (bench, _bench), (tune, _tune)):
        module.add_arguments(command)
        command.set_defaults(run=module.run_command, subparser=command)
    return p


def _status(code: object) -> int:
    """``SystemExit.code`` as an exit status, as the interpreter would turn it into one."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    """Parse the command line and run the subcommand.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program name (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: the subcommand's; 0 after ``--help`` or ``--version``; 2 for no
        command or bad arguments (argparse's message on stderr).
    """
    args_in = sys.argv[1:] if argv is None else list(argv)
    prog = "hpccoll" if os.path.basename(sys.argv[0] if sys.argv else "") == "hpccoll" else "python -m hpccoll"
    p = parser(prog)
    try:
        args = p.parse_args(args_in)
        if args.run is None:
            p.print_help()
            return 2
        shown = args_in[args_in.index(args.command) + 1 :]
        return int(args.run(args, args.subparser, shown))
    except SystemExit as exc:  # argparse's --help, --version and errors
        return _status(exc.code)


if __name__ == "__main__":
    sys.exit(main())
