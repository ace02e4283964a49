"""The kinds of ``lmdbio bench KIND``: one module each, with ``add_arguments(parser)`` and
``main(args) -> int`` (:mod:`lmdbio.commands.bench` maps the names and holds their help)."""
