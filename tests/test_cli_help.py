"""``--help`` is written for users (issue 36, point 7): plain text, no reStructuredText
leaking from docstrings (double backquotes, :mod: roles), an example per command, every
option explained, ``convert``'s help showing each layout's options (all of them grouped,
or one layout's with ``--layout L``), ``launch``'s usage naming ``-- COMMAND``."""

from __future__ import annotations

import argparse

import pytest

from lmdbio.cli import COMMANDS, build_parser, main
from lmdbio.commands.bench import BENCHMARKS
from lmdbio.commands.convert import layout_parser
from lmdbio.commands.helptext import RST_MARKUP, plain
from lmdbio.convert import LAYOUTS

COMMAND_LINES = [[], *([name] for name in COMMANDS),
                 *(["bench", kind] for kind in BENCHMARKS),
                 *(["convert", "--layout", layout] for layout in LAYOUTS)]


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``lmdbio ARGV --help`` prints (and that it exits 0)."""
    try:
        code = main([*argv, "--help"])
    except SystemExit as exc:  # argparse's own help action
        code = exc.code
    out = capsys.readouterr()
    assert code in (0, None), out.err
    return out.out


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=lambda a: " ".join(a) or "lmdbio")
def test_help_is_plain_text_with_examples(argv: list[str], capsys) -> None:
    text = help_text(argv, capsys)
    assert text.startswith("usage: ")
    leaked = sorted({m.group(0) for m in RST_MARKUP.finditer(text)})
    assert not leaked, f"reStructuredText in the help of {argv}: {leaked}\n{text}"
    assert "\nexamples:\n" in text, text
    examples = text.split("\nexamples:\n", 1)[1]
    assert "lmdbio" in examples or "make run" in examples


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    out = [("lmdbio", build_parser())]
    for name, parser in list(out):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
    for name, parser in list(out):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
    out += [(f"convert --layout {layout}", layout_parser(layout)) for layout in LAYOUTS]
    return out


def test_every_option_says_what_it_does() -> None:
    missing = [f"{where}: {action.option_strings or action.dest}"
               for where, parser in _parsers() for action in parser._actions
               if not isinstance(action, argparse._SubParsersAction)
               and action.help != argparse.SUPPRESS and not (action.help or "").strip()]
    assert not missing, missing


def test_run_metrics_json_has_help(capsys) -> None:
    text = help_text(["run"], capsys)
    options = text.split("\noptions:\n", 1)[1]
    line = next(x for x in options.splitlines() if x.strip().startswith("--metrics-json OUT"))
    assert "JSON" in line.split("--metrics-json OUT", 1)[1], text


def test_launch_usage_names_the_command_after_the_double_dash(capsys) -> None:
    usage = help_text(["launch"], capsys).split("\n\n", 1)[0]
    assert "CONFIG [-- COMMAND" in usage, usage


def _options(layout: str) -> list[str]:
    return [a.option_strings[-1] for a in layout_parser(layout)._actions if a.option_strings]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("order", ["layout-first", "help-first"])
def test_convert_help_with_a_layout_shows_that_layouts_options(layout: str, order: str,
                                                               capsys) -> None:
    argv = ["convert", "--layout", layout, "--help"] if order == "layout-first" else \
        ["convert", "--help", "--layout", layout]
    code = main(argv)
    text = capsys.readouterr().out
    assert code == 0
    assert f"{layout} options (--layout {layout}" in text, text
    mine = _options(layout)
    assert mine and all(opt in text for opt in mine), (mine, text)
    others = {opt for other in LAYOUTS if other != layout for opt in _options(other)}
    assert not [o for o in others - set(mine) if f"  {o} " in text or f"  {o}\n" in text], \
        "another layout's options shown"


def test_convert_help_lists_every_layouts_options_grouped(capsys) -> None:
    text = help_text(["convert"], capsys)
    for layout in LAYOUTS:
        head = f"{layout} options (--layout {layout}"
        assert head in text, text
        section = text.split(head, 1)[1].split("\n\n", 1)[0]
        assert all(opt in section for opt in _options(layout)), (layout, section)
    assert "lmdbio convert --layout LAYOUT --help" in text


def test_convert_without_its_arguments_says_what_is_missing(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["convert", "sklearn:digits"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "DST" in err and "--layout" in err and "lmdbio convert --help" in err


def test_plain_removes_restructuredtext() -> None:
    text = plain("see :mod:`lmdbio.convert`, :func:`~lmdbio.open` and ``--layout``::\n\n  x")
    assert text == "see lmdbio.convert, open and --layout:\n\n  x"
    assert not RST_MARKUP.search(text)
