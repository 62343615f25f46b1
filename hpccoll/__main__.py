"""Command line: ``python -m hpccoll info`` and ``mpiexec -n N python -m hpccoll bench``.

Run it under ``python -m mpi4py -m hpccoll ...`` (or through the ``hpccoll``
console script) to have an error on one rank abort the whole job.
"""

from __future__ import annotations

import sys
from typing import List, Optional

USAGE = """usage: python -m hpccoll {info,bench} [options]

  info    MPI, GPU and transport report (printed once, by rank 0)
  bench   nccl-tests style bandwidth table; `python -m hpccoll bench -h` lists the options
"""


def main(argv: Optional[List[str]] = None) -> int:
    """Dispatch to a subcommand; return the exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "info":
        from ._info import main as run
    elif command == "bench":
        from ._bench import main as run
    else:
        print(f"hpccoll: expected a command among info, bench; got {command!r}\n{USAGE}", end="", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
