"""The YAML job schema: defaults, overrides, paths, round trips, every kind of error, the
example configs, and the generated reference in docs/configuration.md."""

from __future__ import annotations

import ast
import dataclasses
import os
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdbio.config import (
    CodecConfig,
    ConfigOrigin,
    DatasetConfig,
    JobConfig,
    ReadersConfig,
    TransformConfig,
    check_combinations,
    load_config,
    render_reference,
    setting_error,
)
from lmdbio.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
MINIMAL = {"dataset": {"path": "/data/x"}}


def _error(source, overrides=()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(source, overrides)
    return info.value


def test_defaults_match_the_documented_schema():
    cfg = load_config(MINIMAL)
    assert cfg.dataset.path == "/data/x"
    assert cfg.dataset.layout == "caffe-datum"
    assert cfg.dataset.subdb is None and cfg.dataset.scan_groups is None
    assert (cfg.batch.size, cfg.batch.last) == (64, "pad")
    r = cfg.readers
    assert (r.strategy, r.mode, r.per_node, r.prefetch_depth) == ("dm-spec", "auto", 0, 4)
    assert (cfg.shuffle.mode, cfg.shuffle.seed) == ("none", 0)
    t = cfg.transform
    assert (t.scale, t.mean_values, t.mean_file, t.crop_size, t.mirror, t.phase) == (
        1.0, (), None, 0, False, "train")
    assert cfg.codec.name == "none" and cfg.codec.options == ()
    assert cfg.workers.device == "auto"
    assert cfg.topology.simulate_nodes is None  # LMDBIO_SIMULATE_NODES, else 0 (Topology.build)
    assert (cfg.epochs, cfg.on_error, cfg.metrics.every) == (1, "raise", 50)


def test_config_is_frozen_and_hashable():
    cfg = load_config(MINIMAL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epochs = 3  # type: ignore[misc]
    assert hash(cfg) == hash(load_config(MINIMAL))


def test_to_dict_round_trips_and_is_plain_yaml():
    cfg = load_config({
        "dataset": {"path": "/d", "layout": "pcr", "scan_groups": 2},
        "transform": {"mean_values": [104, 117, 123], "crop_size": 3, "mirror": True},
        "codec": {"name": "ibp", "chunk_bytes": 8, "thresholds": [0.8, 0.9]},
        "readers": {"strategy": "indexed"}, "shuffle": {"mode": "block", "window": 3},
    })
    d = cfg.to_dict()
    assert d["codec"] == {"name": "ibp", "chunk_bytes": 8, "thresholds": [0.8, 0.9]}
    assert d["transform"]["mean_values"] == [104.0, 117.0, 123.0]
    text = yaml.safe_dump(d)  # only plain types inside
    assert load_config(yaml.safe_load(text)) == cfg
    assert load_config(d) == cfg
    assert load_config(cfg) == cfg
    assert cfg.codec.options_dict() == {"chunk_bytes": 8, "thresholds": [0.8, 0.9]}


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 10_000), last=st.sampled_from(["pad", "drop", "partial"]),
    strategy=st.sampled_from(["dm-spec", "indexed", "lmm", "dm-serial", "naive-stride",
                              "naive-contig"]),
    scale=st.floats(-1e6, 1e6, allow_nan=False), crop=st.integers(0, 512),
    means=st.lists(st.floats(-300, 300, allow_nan=False), max_size=4),
    epochs=st.integers(1, 100), on_error=st.sampled_from(["raise", "skip", "substitute"]),
)
def test_round_trip_property(size, last, strategy, scale, crop, means, epochs, on_error):
    raw = {"dataset": {"path": "/p"}, "batch": {"size": size, "last": last},
           "readers": {"strategy": strategy}, "transform": {"scale": scale, "crop_size": crop,
                                                            "mean_values": means},
           "epochs": epochs, "on_error": on_error}
    cfg = load_config(raw)
    assert load_config(cfg.to_dict()) == cfg
    assert cfg.batch.size == size and cfg.transform.mean_values == tuple(float(m) for m in means)


def test_overrides_are_yaml_scalars_and_lists():
    cfg = load_config(MINIMAL, ["batch.size=128", "transform.mean_values=[1, 2.5, 3]",
                                "transform.mirror=true", "dataset.subdb=images",
                                "readers.strategy=indexed", "shuffle.mode=global",
                                "codec.name=ibp", "codec.chunk_bytes=4", "epochs=3"])
    assert cfg.batch.size == 128
    assert cfg.transform.mean_values == (1.0, 2.5, 3.0)
    assert cfg.transform.mirror is True
    assert cfg.dataset.subdb == "images"
    assert cfg.shuffle.mode == "global" and cfg.readers.strategy == "indexed"
    assert cfg.codec.options == (("chunk_bytes", 4),)
    assert cfg.epochs == 3
    back = load_config(cfg, ["dataset.subdb=null"])
    assert back.dataset.subdb is None and back.batch.size == 128


def test_override_errors_name_the_key():
    assert "batch.sise" in str(_error(MINIMAL, ["batch.sise=3"]))
    assert "expected key.path=value" in str(_error(MINIMAL, ["batch.size"]))
    assert "epochs is not a section" in str(_error(MINIMAL, ["epochs=2", "epochs.x=1"]))
    assert "epochs: must be an integer, not a mapping" in str(_error(MINIMAL, ["epochs.x=1"]))
    err = _error(MINIMAL, ["batch.size=abc"])
    assert "batch.size" in str(err) and "integer" in str(err)


def test_relative_paths_resolve_against_the_config_folder(tmp_path, monkeypatch):
    sub = tmp_path / "jobs"
    sub.mkdir()
    f = sub / "job.yaml"
    f.write_text("dataset: {path: ../data/lmdb}\ntransform: {mean_file: mean.binaryproto}\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(f)
    assert cfg.dataset.path == os.path.normpath(tmp_path / "data" / "lmdb")
    assert cfg.transform.mean_file == str(sub / "mean.binaryproto")
    # an override is a command-line path: relative to the working directory
    cfg2 = load_config(f, ["dataset.path=other/db"])
    assert cfg2.dataset.path == str(tmp_path / "other" / "db")
    # absolute paths and ~ are kept / expanded
    assert load_config(f, ["dataset.path=/abs/db"]).dataset.path == "/abs/db"
    home = load_config(f, ["dataset.path=~/db"]).dataset.path
    assert home == os.path.expanduser("~/db")
    # a mapping source keeps relative paths unless base_dir is given
    assert load_config({"dataset": {"path": "rel"}}).dataset.path == "rel"
    assert load_config({"dataset": {"path": "rel"}}, base_dir="/b").dataset.path == "/b/rel"


def test_unknown_key_suggests_the_closest():
    err = _error({"dataset": {"path": "/x"}, "batch": {"sise": 3}})
    msg = str(err)
    assert "batch.sise" in msg and "did you mean 'size'" in msg and "size, last" in msg
    assert err.problems[0].path == "batch.sise"  # type: ignore[attr-defined]
    err = _error({"dataset": {"path": "/x"}, "trasnform": {}})
    assert "did you mean 'transform'" in str(err)
    err = _error({"dataset": {"path": "/x"}, "zzz": 1})
    assert "zzz: unknown key; allowed keys here:" in str(err)


@pytest.mark.parametrize(("raw", "path", "needle"), [
    ({"batch": {"size": "64"}}, "batch.size", "must be an integer, not string '64'"),
    ({"batch": {"size": 6.5}}, "batch.size", "must be an integer"),
    ({"batch": {"size": True}}, "batch.size", "must be an integer, not boolean true"),
    ({"transform": {"mirror": "yes"}}, "transform.mirror", "must be a boolean"),
    ({"transform": {"scale": "x"}}, "transform.scale", "must be a number"),
    ({"transform": {"scale": float("nan")}}, "transform.scale", "finite"),
    ({"transform": {"mean_values": 128}}, "transform.mean_values", "must be a list"),
    ({"transform": {"mean_values": [1, "a"]}}, "transform.mean_values[1]", "finite number"),
    ({"dataset": {"path": 5}}, "dataset.path", "must be a string"),
    ({"dataset": {"path": ""}}, "dataset.path", "must not be empty"),
    ({"batch": 5}, "batch", "must be a mapping"),
    ({"batch": {"last": "fill"}}, "batch.last", "allowed: pad, drop, partial"),
    ({"readers": {"strategy": "dm_spec"}}, "readers.strategy", "did you mean 'dm-spec'"),
    ({"on_error": False}, "on_error", "quote the value"),
    ({"dataset": {"layout": "lmdb"}}, "dataset.layout", "allowed: caffe-datum, tensor"),
    ({"readers": {"checksum": "md5"}}, "readers.checksum", "allowed: xxh64, crc32, none"),
])
def test_wrong_types_and_values(raw, path, needle):
    base = {"dataset": {"path": "/x"}}
    for k, v in raw.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) and k in base else v
    msg = str(_error(base))
    assert f"{path}: " in msg and needle in msg


@pytest.mark.parametrize(("raw", "path"), [
    ({"batch": {"size": 0}}, "batch.size"),
    ({"readers": {"per_node": -1}}, "readers.per_node"),
    ({"readers": {"prefetch_depth": 0}}, "readers.prefetch_depth"),
    ({"transform": {"crop_size": -1}}, "transform.crop_size"),
    ({"epochs": 0}, "epochs"),
    ({"dataset": {"path": "/x", "layout": "pcr", "scan_groups": 0}}, "dataset.scan_groups"),
    ({"shuffle": {"seed": -1}}, "shuffle.seed"),
    ({"topology": {"simulate_nodes": -2}}, "topology.simulate_nodes"),
])
def test_minimums(raw, path):
    msg = str(_error({"dataset": {"path": "/x"}, **raw}))
    assert f"{path}: must be >= " in msg


def test_impossible_combinations():
    msg = str(_error({"dataset": {"path": "/x"},
                      "transform": {"mean_values": [1], "mean_file": "/m"}}))
    assert "transform.mean_file" in msg and "mean_values" in msg
    msg = str(_error({"dataset": {"path": "/x"}, "shuffle": {"mode": "global"}}))
    assert "shuffle.mode" in msg and "needs readers.strategy: indexed" in msg
    assert "'dm-spec'" in msg
    load_config({"dataset": {"path": "/x"}, "shuffle": {"mode": "block"},
                 "readers": {"strategy": "indexed"}})
    msg = str(_error({"dataset": {"path": "/x", "scan_groups": 2}}))
    assert "dataset.scan_groups" in msg and "only applies to dataset.layout: pcr" in msg
    msg = str(_error({"dataset": {"path": "/x", "layout": "toc"}, "transform": {"crop_size": 4}}))
    assert "transform.crop_size" in msg and "image records" in msg
    # scale and means too: the loader transforms image batches only, rows never
    msg = str(_error({"dataset": {"path": "/x", "layout": "ibp"},
                      "transform": {"scale": 0.5, "mean_values": [1], "phase": "test"}}))
    assert "transform.scale: needs image records" in msg
    assert "transform.mean_values: needs image records" in msg and "phase" not in msg
    every = TransformConfig(scale=0.5, mean_values=(1.0,), mean_file="/m", crop_size=2,
                            mirror=True, phase="test")
    assert every.active_keys() == tuple(f.name for f in dataclasses.fields(TransformConfig)
                                        if f.name != "phase")
    assert TransformConfig(phase="test").active_keys() == ()
    for layout in ("caffe-datum", "tensor", "pcr"):  # the image layouts take all of it
        load_config({"dataset": {"path": "/x", "layout": layout},
                     "transform": {"scale": 0.5, "mean_values": [1], "crop_size": 2,
                                   "mirror": True}})
    msg = str(_error({"dataset": {"path": "/x"}, "codec": {"level": 3}}))
    assert "codec" in msg and "level" in msg and "codec.name is 'none'" in msg
    msg = str(_error({"dataset": {"path": "/x"}, "codec": {"name": "ibp", "x": {"a": 1}}}))
    assert "codec.x" in msg


@pytest.mark.parametrize(("text", "line", "path", "needles"), [
    ("codec:\n  name: toc\n", 4, "codec.name",
     ["string 'toc' is not allowed; allowed: none, ibp; 'toc' is a storage layout, not a "
      "transport codec: set dataset.layout: toc and codec.name: none"]),
    ("readers:\n  strategy: naive-stride\ncodec:\n  name: ibp\n", 6, "codec.name",
     ["needs a node-level readers.strategy: lmm | dm-serial | dm-spec | indexed",
      "set readers.strategy: dm-spec or codec.name: none"]),
    ("  layout: pcr\nreaders:\n  transfer: spans\n", 5, "readers.transfer",
     ["layout 'pcr' and codec 'none'", "set readers.transfer: copy or auto"]),
    ("codec:\n  name: ibp\nreaders:\n  transfer: spans\n", 6, "readers.transfer",
     ["layout 'caffe-datum' and codec 'ibp'"]),
    ("readers:\n  strategy: naive-contig\n  per_node: 2\n", 5, "readers.per_node",
     ["2 groups a node's ranks around readers, which a node-level readers.strategy has "
      "(lmm | dm-serial | dm-spec | indexed); strategy 'naive-contig' has none",
      "remove readers.per_node or set readers.strategy: dm-spec"]),
    ("  layout: btable\n", 3, "dataset.layout",
     ["string 'btable' is not allowed; allowed: caffe-datum, tensor, toc, ibp, pcr; the "
      "loader has no decoder for 'btable'"]),
])
def test_job_rules_refuse_at_load_with_file_and_line(tmp_path, text, line, path,
                                                           needles):
    """What the loader used to refuse when the job started (the codec, the ring's
    transfer, a layout it cannot decode) is refused by load_config, at
    the key's line."""
    f = tmp_path / "job.yaml"
    f.write_text("dataset:\n  path: /x\n" + text)
    msg = str(_error(f))
    assert f"{f}:{line}: {path}: " in msg
    for needle in needles:
        assert needle in msg


def test_a_config_built_in_code_is_refused_as_a_loaded_one():
    """check_combinations (what the run plan calls) refuses the names load_config refuses
    at their keys, for a JobConfig built in code: the same words, the same hints."""
    cfg = JobConfig(DatasetConfig("/x", layout="btable"), codec=CodecConfig("toc"),
                    on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        check_combinations(cfg)
    problems = {p.path: p.message for p in info.value.problems}  # type: ignore[attr-defined]
    assert set(problems) == {"dataset.layout", "codec.name", "on_error"}
    raw = {"dataset": {"path": "/x", "layout": "btable"}, "codec": {"name": "toc"},
           "on_error": "ignore"}
    loaded = {p.path: p.message for p in _error(raw).problems}  # type: ignore[attr-defined]
    assert problems == loaded
    assert "did you mean" not in problems["dataset.layout"]


def test_transport_rules_allow_what_the_loader_runs():
    load_config({"dataset": {"path": "/x"}, "readers": {"transfer": "spans"}})
    load_config({"dataset": {"path": "/x"}, "readers": {"strategy": "lmm", "per_node": 2}})
    load_config({"dataset": {"path": "/x"}, "readers": {"strategy": "naive-stride",
                                                        "per_node": 0}})
    load_config({"dataset": {"path": "/x", "layout": "pcr"}, "readers": {"transfer": "copy"}})
    load_config({"dataset": {"path": "/x"}, "codec": {"name": "ibp"},
                 "readers": {"strategy": "lmm"}})


def test_every_problem_is_reported_at_once():
    err = _error({"dataset": {"path": "/x"}, "batch": {"size": 0, "last": "x"}, "epochs": "2"})
    paths = [p.path for p in err.problems]  # type: ignore[attr-defined]
    assert paths == ["batch.size", "batch.last", "epochs"]
    assert "3 problems" in str(err)


def test_missing_dataset_and_path():
    assert "dataset: required section missing" in str(_error({}))
    assert "dataset.path: required key missing" in str(_error({"dataset": {}}))
    assert "must be a file path, a mapping or a JobConfig" in str(_error([1, 2]))  # type: ignore


def test_file_errors_carry_file_and_line(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("dataset:\n  path: /x\nbatch:\n  size: 64\n  last: fil\n")
    msg = str(_error(f))
    assert f"{f}:5: batch.last" in msg and "did you mean 'pad'" not in msg
    f.write_text("dataset:\n  path: /x\nbatch:\n  size: [1\n")
    msg = str(_error(f))
    assert str(f) in msg and "YAML syntax error" in msg
    line = int(msg.split(f"{f}:")[1].split(":")[0])
    assert line in (4, 5)  # the unclosed list: PyYAML reports where it noticed
    f.write_text("dataset:\n  path: /x\ndataset:\n  path: /y\n")
    msg = str(_error(f))
    assert f"{f}:3: duplicate key 'dataset' (first at line 1)" in msg
    assert "config file not found" in str(_error(tmp_path / "nope.yaml"))
    f.write_text("- a\n- b\n")
    assert "must be a mapping of sections" in str(_error(f))
    f.write_text("")
    assert "dataset: required section missing" in str(_error(f))


def test_a_loaded_config_keeps_where_its_keys_were_written(tmp_path):
    """The origin lets a refusal made after loading (the run plan's) name the line; it is
    not a setting: equality, to_dict and a pickled copy are as without it."""
    import pickle

    f = tmp_path / "job.yaml"
    f.write_text("dataset:\n  path: /x\nbatch:\n  size: 8\ncodec:\n  name: ibp\n"
                 "  chunk_bytes: 4\n")
    cfg = load_config(f)
    assert cfg.origin.filename == str(f)
    assert cfg.origin.location("batch.size") == f"{f}:4"
    assert cfg.origin.location("batch.last") == f"{f}:3"  # a default: its section
    assert cfg.origin.location("codec.chunk_bytes") == f"{f}:7"
    assert cfg.origin.location("shuffle.mode") is None  # neither written
    assert cfg == load_config(cfg.to_dict()) and "origin" not in cfg.to_dict()
    assert pickle.loads(pickle.dumps(cfg)).origin == cfg.origin
    assert load_config({"dataset": {"path": "/x"}}).origin == ConfigOrigin()
    assert load_config(cfg, ["batch.size=16"]).origin == cfg.origin  # a JobConfig keeps its


def test_setting_error_has_load_configs_form(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("dataset:\n  path: /x\nbatch:\n  size: 8\n")
    err = setting_error(load_config(f).origin, "batch.size", "is too small")
    assert str(err) == f"invalid job configuration {f}: {f}:4: batch.size: is too small"
    assert err.path == "batch.size"  # type: ignore[attr-defined]
    assert [p.location for p in err.problems] == [f"{f}:4"]  # type: ignore[attr-defined]
    err = setting_error(load_config(MINIMAL).origin, "batch.size", "is too small")
    assert str(err) == "invalid job configuration: batch.size: is too small"


def test_check_combinations_refuses_a_config_built_in_code():
    cfg = JobConfig(dataset=DatasetConfig(path="/x"), codec=CodecConfig(name="ibp"),
                    readers=ReadersConfig(strategy="naive-stride"))
    with pytest.raises(ConfigError, match=r"^invalid job configuration: codec\.name: 'ibp' "
                                          "compresses the batches of a node's ring"):
        check_combinations(cfg)
    check_combinations(load_config(MINIMAL))  # a valid one passes


def test_example_configs_validate():
    files = sorted((REPO / "configs").glob("*.yaml"))
    names = {f.stem for f in files}
    assert {"quickstart", "caffe-imagenet-like", "toc-logreg", "ibp-gpu", "pcr"} <= names
    for f in files:
        cfg = load_config(f)
        assert isinstance(cfg, JobConfig)
        assert Path(cfg.dataset.path).is_absolute()
        assert load_config(cfg.to_dict()) == cfg


def test_reference_doc_is_generated_from_the_schema():
    text = render_reference()
    committed = (REPO / "docs" / "configuration.md").read_text()
    assert committed == text, "regenerate: python -m lmdbio.config > docs/configuration.md"
    # every key of every section is in the reference
    hints = typing.get_type_hints(JobConfig)
    for f in dataclasses.fields(JobConfig):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            for g in dataclasses.fields(tp):
                name = "<option>" if g.name == "options" else g.name
                assert f"| `{f.name}.{name}` |" in text
        else:
            assert f"| `{f.name}` |" in text
    assert "`transform.crop_size` | integer, >= 0 | `0` |" in text
    for value in ("dm-spec", "indexed", "naive-stride", "substitute", "caffe-datum"):
        assert f"- `{value}`: " in text


def _literal_declarations(package: Path) -> dict[frozenset[str], list[tuple[Path, int]]]:
    """Every ``Literal[...]`` of strings in the package's sources, by its set of values:
    ``(file relative to the package, line)`` of each."""
    found: dict[frozenset[str], list[tuple[Path, int]]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Subscript) and (
                    (isinstance(node.value, ast.Name) and node.value.id == "Literal")
                    or (isinstance(node.value, ast.Attribute) and node.value.attr == "Literal"))):
                continue
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            values = frozenset(e.value for e in elts
                               if isinstance(e, ast.Constant) and isinstance(e.value, str))
            found.setdefault(values, []).append((path.relative_to(package), node.lineno))
    return found


def test_closed_vocabularies_are_declared_once():
    """Last-batch policies, shuffle modes, reader modes and slot checksums are declared
    once, as the Literal types of the code that implements them; the schema's fields and
    that code's tuples and tables all come from those declarations."""
    from lmdbio import plan, topology
    from lmdbio.plan import epoch
    from lmdbio.run_plan import slot_checksum
    from lmdbio.shm import layout

    fields = {
        "batch.last": epoch.LastBatch,
        "shuffle.mode": epoch.ShuffleMode,
        "readers.mode": topology.ReaderMode,
        "readers.checksum": layout.SlotChecksum,
    }
    hints = typing.get_type_hints(JobConfig)
    for dotted, declared in fields.items():
        section, key = dotted.split(".")
        assert typing.get_type_hints(hints[section])[key] is declared, dotted
    # typing caches Literal types, so the ``is`` above holds for a second, equal
    # declaration too: the sources must hold each vocabulary's Literal exactly once, in the
    # module that implements it
    package = Path(plan.__file__).parent.parent
    found = _literal_declarations(package)
    homes = {"batch.last": epoch, "shuffle.mode": epoch, "readers.mode": topology,
             "readers.checksum": layout}
    for dotted, declared in fields.items():
        where = found.get(frozenset(typing.get_args(declared)), [])
        home = Path(homes[dotted].__file__).relative_to(package)
        assert [path for path, _ in where] == [home], (dotted, where)
    assert typing.get_args(epoch.LastBatch) == plan.LAST_POLICIES
    assert typing.get_args(epoch.ShuffleMode) == plan.SHUFFLE_MODES
    assert typing.get_args(topology.ReaderMode) == topology.MODES
    assert tuple(layout.CHECKSUM_NAMES) == typing.get_args(layout.SlotChecksum)
    assert layout.CHECKSUM_NAMES["xxh64"] == layout.CHECKSUM_XXH64
    assert layout.CHECKSUM_NAMES["none"] == layout.CHECKSUM_NONE
    with pytest.raises(ConfigError, match="must be 'xxh64', 'crc32' or 'none'"):
        slot_checksum("md5")


def test_was_loaded_tells_a_loaded_config_from_one_built_or_replaced_in_code():
    """RunPlan.resolve checks the combinations again only where load_config did not."""
    import dataclasses

    from lmdbio.config import DatasetConfig, JobConfig, load_config, was_loaded

    loaded = load_config({"dataset": {"path": "x", "layout": "caffe-datum"}})
    assert was_loaded(loaded)
    assert not was_loaded(dataclasses.replace(loaded, epochs=3))
    assert not was_loaded(JobConfig(dataset=DatasetConfig(path="x")))
