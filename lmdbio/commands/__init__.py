"""One module per ``lmdbio`` sub-command (see :mod:`lmdbio.cli`)."""
