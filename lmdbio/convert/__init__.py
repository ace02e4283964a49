"""Writers of LMDB layouts: one module per layout, loaded by name (the layout's
``converter`` in the registry :data:`lmdbio.layouts.LAYOUTS`, re-exported here).

Every layout module exposes ``add_arguments(parser)`` for its own options and
``convert(src, dst, args) -> dict`` returning a summary (records written, bytes, ratio...).
Shared helpers (creating the environment, writing in commits, the metadata sidecar) are in
:mod:`lmdbio.convert.writer`.
"""

from __future__ import annotations

from types import ModuleType

from lmdbio.errors import LmdbioError
from lmdbio.layouts import LAYOUTS


def load_layout(name: str) -> ModuleType:
    """Import the module that writes layout ``name`` (its ``converter`` in
    :data:`lmdbio.layouts.LAYOUTS`)."""
    try:
        layout = LAYOUTS[name]
    except KeyError:
        raise LmdbioError(f"unknown layout {name!r}; known: {', '.join(sorted(LAYOUTS))}") from None
    return layout.converter_module()


__all__ = ["LAYOUTS", "load_layout"]
