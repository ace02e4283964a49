"""The registries are the one vocabulary: strategies (:data:`lmdbio.plan.strategies.
STRATEGIES`), layouts (:data:`lmdbio.layouts.LAYOUTS`) and batch codecs
(:data:`lmdbio.codecs.registry.BATCH_CODECS`). The job configuration accepts exactly their
names, the generated reference lists exactly them, the commands offer them, and an unknown
name is refused with the registered ones listed."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmdbio.codecs.registry import BATCH_CODECS, BatchCodec, get_batch_codec
from lmdbio.config import JobConfig, load_config, render_reference
from lmdbio.errors import ConfigError, LmdbioError
from lmdbio.layouts import LAYOUTS, Layout, get_layout, layout_names
from lmdbio.plan.strategies import STRATEGIES, ReadStrategy, strategy_class

REPO = Path(__file__).resolve().parents[1]

#: (config key, registry, the capability a registered name needs there) for every key
#: whose values a registry names
REGISTERED_KEYS = [
    ("readers.strategy", STRATEGIES, lambda cls: True),
    ("dataset.layout", LAYOUTS, lambda layout: layout.decoder is not None),  # a job reads it
    ("codec.name", BATCH_CODECS, lambda spec: spec.transport),  # a ring carries it
]


def _field(dotted: str) -> tuple[dataclasses.Field, typing.Any]:
    section, key = dotted.split(".")
    cls = typing.get_type_hints(JobConfig)[section]
    return {f.name: f for f in dataclasses.fields(cls)}[key], cls


def _error(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        load_config({"dataset": {"path": "/x"}, **raw})
    return str(info.value)


def _raw(dotted: str, value: object) -> dict:
    section, key = dotted.split(".")
    raw: dict = {section: {key: value}}
    if section == "dataset":
        raw["dataset"]["path"] = "/x"
    return raw


def _capable(registry: dict, capable: typing.Callable[[typing.Any], bool]) -> list[str]:
    return [name for name, entry in registry.items() if capable(entry)]


@pytest.mark.parametrize(("key", "registry", "capable"), REGISTERED_KEYS)
def test_the_config_accepts_exactly_the_registered_names(key, registry, capable):
    """A key accepts the registered names with the capability it needs, in registry
    order; the others are refused with the reason, the allowed names listed."""
    f, _ = _field(key)
    allowed = _capable(registry, capable)
    assert list(f.metadata["choices"]) == allowed  # the allowed values, in order
    for name in registry:
        if name not in allowed:
            msg = _error(_raw(key, name))
            assert f"{key}: string {name!r} is not allowed; allowed: {', '.join(allowed)}; " \
                   f"{f.metadata['refused'][name]}" in msg
            continue
        cfg = load_config({"dataset": {"path": "/x"}, **_raw(key, name)})
        section, k = key.split(".")
        assert getattr(getattr(cfg, section), k) == name
    msg = _error(_raw(key, "no-such-name"))
    assert f"{key}: string 'no-such-name' is not allowed; allowed: " \
           f"{', '.join(allowed)}" in msg
    assert "not a transport codec" in _error(_raw("codec.name", "toc"))
    assert "the loader has no decoder" in _error(_raw("dataset.layout", "btable"))


@pytest.mark.parametrize(("key", "registry", "capable"), REGISTERED_KEYS)
def test_the_reference_lists_exactly_the_registered_names(key, registry, capable):
    """The reference lists the names a key accepts, each with its entry's summary, and
    names the registered ones it does not accept in the key's meaning."""
    text = (REPO / "docs" / "configuration.md").read_text()
    assert text == render_reference(), \
        "regenerate: python -m lmdbio.config > docs/configuration.md"
    allowed = _capable(registry, capable)
    row = next(line for line in text.splitlines() if line.startswith(f"| `{key}` |"))
    type_cell = row.split(" | ")[1]
    assert re.findall(r"`([^`]+)`", type_cell) == allowed
    block = text.split(f"\n`{key}`:\n\n", 1)[1].split("\n\n", 1)[0]
    listed = [re.match(r"- `([^`]+)`: ", line).group(1) for line in block.splitlines()]
    assert listed == allowed
    for name, entry in registry.items():  # each described by its own entry, or refused
        if name in allowed:
            assert f"- `{name}`: {entry.summary}" in text
        else:
            assert f"`{name}`" in row.split(" | ")[3]


def test_the_reference_derives_the_rules_from_capabilities():
    text = render_reference()
    shuffling = [n for n, cls in STRATEGIES.items() if cls.shuffles]
    assert f"needs `readers.strategy: {' | '.join(shuffling)}`" in text
    images = ", ".join(f"`{n}`" for n in layout_names(image=True))
    assert f"`dataset.layout` one of {images}." in text
    progressive = " | ".join(layout_names(progressive=True))
    assert f"only applies to `dataset.layout: {progressive}`" in text
    # batch.size counts images (rows), not records
    row = next(line for line in text.splitlines() if line.startswith("| `batch.size` |"))
    assert "Images (or rows) per global batch" in row
    for name, layout in LAYOUTS.items():
        assert (f"`{name}`" in row.split(" | ")[3]) == (layout.items_field is not None)


def test_unknown_names_list_the_registered_ones():
    with pytest.raises(ConfigError, match="readers.strategy: unknown strategy 'x'; known: "
                       + ", ".join(STRATEGIES)):
        strategy_class("x")
    with pytest.raises(ConfigError, match="dataset.layout: unknown layout 'x'; known: "
                       + ", ".join(LAYOUTS)):
        get_layout("x")
    with pytest.raises(ConfigError, match="codec.name: unknown batch codec 'x'; known: "
                       + ", ".join(BATCH_CODECS)):
        get_batch_codec("x")
    from lmdbio.convert import load_layout

    with pytest.raises(LmdbioError, match="unknown layout 'x'; known: "
                       + ", ".join(sorted(LAYOUTS))):
        load_layout("x")
    # a misspelt name in a job: the allowed names and the closest one
    msg = _error({"readers": {"strategy": "dm_spec"}})
    assert ", ".join(STRATEGIES) in msg and "did you mean 'dm-spec'" in msg
    with pytest.raises(TypeError, match="no field 'colour'"):
        layout_names(colour=True)


def test_strategy_entries():
    for name, cls in STRATEGIES.items():
        assert issubclass(cls, ReadStrategy) and cls.name == name
        assert cls.summary and "\n" not in cls.summary
        assert not (cls.chained and not cls.shared)  # a chain of readers shares its reads
    assert strategy_class("indexed") is STRATEGIES["indexed"]


def test_layout_entries():
    for name, layout in LAYOUTS.items():
        assert isinstance(layout, Layout) and layout.name == name and layout.summary
        assert importlib.util.find_spec(layout.converter) is not None
        factory = layout.decoder_factory()
        assert (factory is None) == (layout.decoder is None)
        if factory is not None:
            assert callable(factory) and factory.__module__ == "loaders.decode"
        # a record of several items says which sidecar field counts them, and what it holds
        assert (layout.items_field is None) == (layout.items_note is None)
        assert not (layout.row_per_record and layout.items_field)
        assert not (layout.batch_per_record and not layout.items_field)
        # records handed out as stored are decoded one row each
        assert not (layout.spans and not layout.row_per_record)
        # the transform's capabilities are those of image layouts
        assert not ((layout.widens or layout.fused_datum) and not layout.image)
    import lmdbio.convert

    assert lmdbio.convert.LAYOUTS is LAYOUTS  # lmdbio convert --layout offers the registry


def test_the_loader_decodes_through_the_registry():
    from loaders.decode import ROW_PER_RECORD_LAYOUTS, make_decoder

    assert frozenset(layout_names(row_per_record=True)) == ROW_PER_RECORD_LAYOUTS
    for name, layout in LAYOUTS.items():
        cfg = SimpleNamespace(dataset=SimpleNamespace(layout=name, path="/x", scan_groups=None),
                              on_error="raise")
        if layout.decoder is None:
            with pytest.raises(ConfigError, match=f"the loader has no decoder for '{name}'"):
                make_decoder(cfg)
        elif name in ("caffe-datum", "tensor", "toc"):  # the others read the data set's sidecar
            assert callable(make_decoder(cfg))


def test_batch_codec_entries():
    for name, spec in BATCH_CODECS.items():
        assert spec.name == name and spec.summary
        cls = spec.codec_class()
        assert (cls is None) == (spec.codec is None)
        if cls is not None:
            codec = cls()
            assert isinstance(codec, BatchCodec)  # the protocol, checked at run time
            assert cls.from_config(codec.get_config()) == codec
    assert BATCH_CODECS["none"].codec is None and BATCH_CODECS["none"].transport
    # a codec that cannot travel through the ring is read as the layout of its name
    for name, spec in BATCH_CODECS.items():
        if not spec.transport:
            assert name in LAYOUTS


def test_record_codecs_follow_the_batch_codec_interface():
    from lmdbio.codecs.btable import SparseRowCodec
    from lmdbio.codecs.datum import DatumCodec
    from lmdbio.codecs.pcr import PCRCodec, ProgressiveTensorCodec
    from lmdbio.codecs.tensor import TensorCodec

    for cls in (DatumCodec, TensorCodec, PCRCodec, ProgressiveTensorCodec, SparseRowCodec):
        for member in ("codec_id", "encode", "decode", "get_config", "from_config"):
            assert hasattr(cls, member), (cls, member)


def test_the_commands_offer_the_registered_strategies():
    from bench.kinds import read
    from lmdbio.scale.project import ALL_STRATEGIES

    parser = argparse.ArgumentParser()
    read.add_arguments(parser)
    (action,) = [a for a in parser._actions if a.dest == "strategy"]
    assert list(action.choices) == list(STRATEGIES)
    assert tuple(STRATEGIES) == ALL_STRATEGIES


def _option(module_name: str, dest: str) -> argparse.Action:
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    (action,) = [a for a in parser._actions if a.dest == dest]
    return action


def test_demo_offers_the_registered_strategies():
    action = _option("lmdbio.commands.demo", "strategy")
    assert list(action.choices) == list(STRATEGIES)
    assert action.default in STRATEGIES


def test_plan_scale_counts_the_registered_strategies(monkeypatch):
    """The help's default ("all N") follows the registry, not a number written by hand."""
    action = _option("lmdbio.commands.plan_scale", "strategies")
    assert f"all {len(STRATEGIES)}: " in action.help
    assert all(name in action.help for name in STRATEGIES)
    monkeypatch.setitem(STRATEGIES, "extra-strategy", strategy_class("indexed"))
    action = _option("lmdbio.commands.plan_scale", "strategies")
    assert f"all {len(STRATEGIES)}: " in action.help and "extra-strategy" in action.help


def test_run_offers_the_configs_slot_checksums(monkeypatch):
    import lmdbio.config

    action = _option("lmdbio.commands.run", "slot_checksum")
    assert list(action.choices) == list(typing.get_args(lmdbio.config.SlotChecksum))
    monkeypatch.setattr(lmdbio.config, "SlotChecksum",
                        typing.Literal["xxh64", "crc32", "none", "sha1"])
    assert "sha1" in _option("lmdbio.commands.run", "slot_checksum").choices
