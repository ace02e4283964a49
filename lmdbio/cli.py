"""The ``lmdbio`` command line: ``inspect | convert | bench | run | launch | demo | plan-scale``.

Each sub-command lives in its own module under :mod:`lmdbio.commands` and exposes
``add_arguments(parser)`` and ``main(args) -> int``; this file only dispatches, so importing
the CLI stays cheap (numba, MPI and codecs are imported by the command that needs them).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from lmdbio.errors import LmdbioError

#: sub-command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("lmdbio.commands.inspect", "describe an LMDB: format, pages, records, order"),
    "convert": ("lmdbio.commands.convert", "convert a data set into an LMDB layout"),
    "bench": ("lmdbio.commands.bench", "run a benchmark (scan, read, toc, ibp, pcr, btable)"),
    "run": ("lmdbio.commands.run", "run a data-loading job from a YAML config"),
    "launch": ("lmdbio.commands.launch", "build and run the mpiexec line for a job"),
    "demo": ("lmdbio.commands.demo", "the quickstart: convert a bundled data set, read it"),
    "plan-scale": ("lmdbio.commands.plan_scale", "project every read strategy to R ranks "
                   "on N nodes (a model, no MPI)"),
}


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser; each command module adds its own options."""
    parser = argparse.ArgumentParser(prog="lmdbio", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # that command is not part of this build
        p = sub.add_parser(name, help=help_text, description=module.__doc__)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lmdbio`` console script."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args._module, "ACCEPTS_EXTRA_ARGS", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra_args = extra
    try:
        return int(args._module.main(args) or 0)
    except LmdbioError as exc:
        from lmdbio.mpiutil import interrupted

        # a JobError carries the code every rank agreed on (and is quiet but on rank 0);
        # an error raised while a Ctrl-C unwound (a ring call finding the ring the signal
        # aborted) is the interruption
        code = getattr(exc, "exit_code", 2)
        if interrupted(exc):
            code = 130
        if not getattr(exc, "quiet", False):
            what = "interrupted" if code == 130 else f"error: {exc}"
            print(f"lmdbio {args.command}: {what}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print(f"lmdbio {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (`lmdbio inspect DB | head`): stop quietly, and
        # keep the interpreter's final flush from raising again on the closed pipe
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a program the signal ended


if __name__ == "__main__":
    sys.exit(main())
