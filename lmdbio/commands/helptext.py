"""Plain-text help for the command line: what ``--help`` prints is read in a terminal, so
the reStructuredText of docstrings (double backquotes, ``:mod:`` roles, ``::`` blocks) is
turned into plain text, and every command's help ends with examples."""

from __future__ import annotations

import argparse
import re
import textwrap

#: a Sphinx role, e.g. :mod:`lmdbio.convert` or :func:`~lmdbio.open`
_ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`<]+?)(?:\s*<[^`]*>)?`")
#: an inline literal, ``text``
_LITERAL = re.compile(r"``(.+?)``", re.S)
#: what a help text must not contain once plain (checked by the tests)
RST_MARKUP = re.compile(r"``|:(?:py:)?(?:mod|func|class|meth|attr|data|obj|exc|ref|doc):`")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written, except that a paragraph of running text is
    wrapped to the terminal: paragraphs with indented lines (lists, tables, examples under
    a heading) keep their lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in re.split(r"\n[ \t]*\n", text.strip("\n")):
            lines = para.splitlines()
            keep = any(line.startswith((" ", "\t")) for line in lines)
            if keep:
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(line.strip() for line in lines),
                                         max(width, 40), initial_indent=indent,
                                         break_on_hyphens=False,
                                         subsequent_indent=indent))
        return "\n\n".join(out)


def plain(text: str | None) -> str | None:
    """``text`` without reStructuredText markup (None stays None)."""
    if not text or text is argparse.SUPPRESS:
        return text

    def role(m: re.Match[str]) -> str:
        name = m.group(2).strip()
        return name.rsplit(".", 1)[-1] if m.group(1) else name

    text = _ROLE.sub(role, text)
    text = _LITERAL.sub(r"\1", text)
    return re.sub(r"(\S)::(\s*\n)", r"\1:\2", text)


def make_plain(parser: argparse.ArgumentParser) -> None:
    """Make ``parser``'s description, epilog and option help plain text, and those of its
    sub-commands."""
    parser.description = plain(parser.description)
    parser.epilog = plain(parser.epilog)
    for action in parser._actions:
        if action.help is not None:
            action.help = plain(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain(choice.help)
            for sub in set(action.choices.values()):
                make_plain(sub)


def epilog(examples: str, more: str = "") -> str:
    """The ``examples:`` section every command's help ends with (``more``: a closing note)."""
    body = "examples:\n" + "\n".join("  " + line if line else ""
                                     for line in examples.strip("\n").splitlines())
    return body + ("\n\n" + more.strip() if more else "")
