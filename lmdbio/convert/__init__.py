"""Writers of LMDB layouts: one module per layout, loaded by name.

Every layout module exposes ``add_arguments(parser)`` for its own options and
``convert(src, dst, args) -> dict`` returning a summary (records written, bytes, ratio...).
Shared helpers (creating the environment, writing in commits, the metadata sidecar) are in
:mod:`lmdbio.convert.writer`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lmdbio.errors import LmdbioError

#: layout name -> module implementing it
LAYOUTS: dict[str, str] = {
    "caffe-datum": "lmdbio.convert.datum",
    "tensor": "lmdbio.convert.tensor",
    "toc": "lmdbio.convert.toc",
    "ibp": "lmdbio.convert.ibp",
    "pcr": "lmdbio.convert.pcr",
    "btable": "lmdbio.convert.btable",
}


def load_layout(name: str) -> ModuleType:
    """Import the module that writes layout ``name``."""
    try:
        module_name = LAYOUTS[name]
    except KeyError:
        raise LmdbioError(f"unknown layout {name!r}; known: {', '.join(sorted(LAYOUTS))}") from None
    return importlib.import_module(module_name)
