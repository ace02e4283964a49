"""The ``lmdbio`` command line: ``inspect | convert | bench | run | launch | demo | plan-scale``.

Each sub-command lives in its own module under :mod:`lmdbio.commands` and exposes
``add_arguments(parser)`` and ``main(args) -> int``; this file only dispatches, so importing
the CLI stays cheap (numba, MPI and codecs are imported by the command that needs them).

Help is plain text written for users: a command module's ``DESCRIPTION`` and ``EXAMPLES``
(its docstring is for developers), and every help string is stripped of reStructuredText
markup (:func:`lmdbio.commands.helptext.make_plain`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from lmdbio.commands.helptext import HelpFormatter, epilog, make_plain
from lmdbio.errors import LmdbioError
from lmdbio.mpiutil import interrupted

#: sub-command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("lmdbio.commands.inspect", "describe an LMDB: what its records are (Caffe "
                "Datum, lmdbio layouts...), sizes, pages, file order"),
    "convert": ("lmdbio.commands.convert", "write a data set (bundled, image folder, file) "
                "into a new LMDB"),
    "bench": ("lmdbio.commands.bench", "measure lmdbio against a baseline in the same run "
              "(scan, read, decode, toc, ibp, pcr, btable)"),
    "run": ("lmdbio.commands.run", "run a data-loading job from a YAML file and report its "
            "throughput (under mpiexec for several ranks)"),
    "launch": ("lmdbio.commands.launch", "start a job's ranks with mpiexec: lmdbio launch "
               "-n N JOB.yaml -- COMMAND"),
    "demo": ("lmdbio.commands.demo", "the quickstart behind make run: convert real digits, "
             "inspect, train on them, compare with py-lmdb"),
    "plan-scale": ("lmdbio.commands.plan_scale", "project every read strategy to R ranks "
                   "on N nodes (a model, no MPI)"),
}

DESCRIPTION = """\
lmdbio reads LMDB data sets (the format Caffe made standard) for distributed training:
one reader per node, batches handed to the node's workers through shared memory.
Run "lmdbio COMMAND --help" for a command's options and examples."""

EXAMPLES = """\
make run                                  # the quickstart: lmdbio demo
lmdbio inspect build/demo/digits-datum
lmdbio convert sklearn:digits build/digits --layout caffe-datum
lmdbio run configs/quickstart.yaml
lmdbio launch -n 4 --simulate-nodes 2 JOB.yaml -- python train.py JOB.yaml"""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser; each command module adds its own options."""
    parser = argparse.ArgumentParser(
        prog="lmdbio", description=DESCRIPTION, epilog=epilog(EXAMPLES),
        formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # that command is not part of this build
        examples = getattr(module, "EXAMPLES", "")
        p = sub.add_parser(
            name, help=help_text,
            description=getattr(module, "DESCRIPTION", None) or module.__doc__,
            epilog=epilog(examples, getattr(module, "MORE_HELP", "")) if examples else None,
            formatter_class=HelpFormatter,
            add_help=getattr(module, "ADD_HELP", True))
        if getattr(module, "USAGE", None):
            p.usage = module.USAGE
        module.add_arguments(p)
        p.set_defaults(_module=module)
    make_plain(parser)
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
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a program the signal ended


if __name__ == "__main__":
    sys.exit(main())
