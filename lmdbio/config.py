"""The YAML job configuration: a typed, frozen schema with defaults, strict validation and a
generated Markdown reference.

A job file is a YAML mapping whose sections mirror the dataclasses below (``dataset``,
``batch``, ``readers``, ``shuffle``, ``transform``, ``codec``, ``workers``, ``topology``,
``metrics``) plus the top-level scalars ``epochs``, ``max_iterations`` and ``on_error``. Only
``dataset.path`` is required; everything else has a default. :func:`load_config` accepts a
file, a mapping or an existing :class:`JobConfig` plus ``key.path=value`` overrides, and
either returns a fully validated :class:`JobConfig` or raises one
:class:`~lmdbio.errors.ConfigError` listing every problem, each with its key path
(``batch.last``), the file and line where it is known, what is allowed, and for a misspelt
key the closest valid one. A loaded :class:`JobConfig` keeps where its keys were written
(:attr:`JobConfig.origin`), so that what is refused later, with the topology or the data set
(:func:`setting_error`, from :meth:`lmdbio.run_plan.RunPlan.resolve`), names the same line.

The schema is the single source of truth: the validator, :meth:`JobConfig.to_dict` and the
reference in ``docs/configuration.md`` (:func:`render_reference`) are all derived from the
dataclass fields and their metadata, so they cannot drift apart. The names of strategies,
layouts and batch codecs, what each can do and their descriptions come from their
registries (:data:`lmdbio.plan.strategies.STRATEGIES`, :data:`lmdbio.layouts.LAYOUTS`,
:data:`lmdbio.codecs.registry.BATCH_CODECS`): a string field whose metadata has
``choices`` accepts only those.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Union, get_args, get_origin

from lmdbio.codecs.registry import BATCH_CODECS
from lmdbio.errors import ConfigError
from lmdbio.layouts import LAYOUTS, layout_names
from lmdbio.plan.epoch import LastBatch, ShuffleMode
from lmdbio.plan.strategies import STRATEGIES, node_level
from lmdbio.shm.layout import SlotChecksum
from lmdbio.topology import ReaderMode

__all__ = [
    "BatchConfig",
    "CodecConfig",
    "ConfigOrigin",
    "ConfigProblem",
    "DatasetConfig",
    "JobConfig",
    "MetricsConfig",
    "ReadersConfig",
    "ShuffleConfig",
    "TopologyConfig",
    "TransformConfig",
    "WorkersConfig",
    "check_combinations",
    "load_config",
    "render_reference",
    "setting_error",
]

# The closed vocabularies the code below them implements are declared there, once, and read
# here: LastBatch and ShuffleMode with the epoch plan (lmdbio.plan.epoch), ReaderMode with the
# topology (lmdbio.topology), SlotChecksum with the slot format (lmdbio.shm.layout). None of
# those modules imports this one, so the imports stay acyclic.
Phase = Literal["train", "test"]
Device = Literal["auto", "cpu", "cuda"]
OnError = Literal["raise", "skip", "substitute"]
Transfer = Literal["auto", "copy", "spans"]


def _code(names: Iterable[str]) -> str:
    """``a, b`` as Markdown code: `` `a`, `b` ``."""
    return ", ".join(f"`{n}`" for n in names)


def _either(names: Iterable[str]) -> str:
    """``a, b, c`` as `` `a`, `b` or `c` ``."""
    *rest, last = [f"`{n}`" for n in names]
    return f"{', '.join(rest)} or {last}" if rest else last


#: strategies whose read order is free, so they can serve a shuffled epoch order
_SHUFFLING = tuple(name for name, cls in STRATEGIES.items() if cls.shuffles)
#: layouts whose records are images (C, H, W), the only ones a DataTransformer crop/mirror fits
_IMAGES = layout_names(image=True)
#: layouts a node's ring can hand out as spans of the database file
_SPANS = layout_names(spans=True)
#: layouts read at a lower fidelity by reading less (``dataset.scan_groups``)
_PROGRESSIVE = layout_names(progressive=True)
#: layouts whose records hold several images or rows
_GROUPED = tuple(name for name, lay in LAYOUTS.items() if lay.items_field)
#: layouts the loader has a decoder for: ``dataset.layout`` accepts these
_DECODABLE = tuple(name for name, lay in LAYOUTS.items() if lay.decoder is not None)
#: layouts ``lmdbio convert`` writes but the loader cannot read (``dataset.layout``
#: refuses them, saying so)
_UNREADABLE = {name: f"the loader has no decoder for {name!r} (it is written and benchmarked "
               "only)" for name in LAYOUTS if name not in _DECODABLE}
#: batch codecs a node's ring can carry: ``codec.name`` accepts these
_TRANSPORT = tuple(name for name, spec in BATCH_CODECS.items() if spec.transport)
#: batch codecs that are storage layouts only (``codec.name`` refuses them, saying so)
_STORAGE_ONLY = {name: f"{name!r} is a storage layout, not a transport codec: set "
                 f"dataset.layout: {name} and codec.name: none"
                 for name in BATCH_CODECS if name not in _TRANSPORT}
#: strategies that read node batches into a node's shared ring (a transport codec's home)
_NODE_LEVEL = node_level()


def _meta(
    doc: str,
    *,
    minimum: int | float | None = None,
    is_path: bool = False,
    choices: Mapping[str, str] | None = None,
    refused: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Metadata of a schema field, read by the validator and by :func:`render_reference`:
    ``choices`` the values a string field accepts (with their descriptions), ``refused``
    names a registry holds that it does not accept, with the reason its refusal gives."""
    return {"doc": doc, "minimum": minimum, "is_path": is_path,
            "choices": dict(choices or {}), "refused": dict(refused or {})}


@dataclass(frozen=True)
class DatasetConfig:
    """Where the records are and how they are laid out."""

    path: str = field(
        metadata=_meta(
            "The LMDB directory (or its `data.mdb`). A relative path in a config file is resolved "
            "against the folder of that file; one given as an override, against the working "
            "directory.",
            is_path=True,
        )
    )
    layout: str = field(
        default="caffe-datum",
        metadata=_meta(
            "How the values are encoded: a layout the loader reads (not among them, written "
            f"by `lmdbio convert` only: {_code(_UNREADABLE)}).",
            choices={name: LAYOUTS[name].summary for name in _DECODABLE},
            refused=_UNREADABLE,
        ),
    )
    subdb: str | None = field(
        default=None,
        metadata=_meta(
            "Name of a named sub-database to read; null reads the unnamed main database "
            "(what Caffe writes)."
        ),
    )
    scan_groups: int | None = field(
        default=None,
        metadata=_meta(
            f"Only for dataset.layout {_either(_PROGRESSIVE)}: how many scan groups (fidelity "
            "levels) to read; null reads all.",
            minimum=1,
        ),
    )


@dataclass(frozen=True)
class BatchConfig:
    """The global batch and what happens to the last, incomplete one of an epoch."""

    size: int = field(
        default=64,
        metadata=_meta(
            "Images (or rows) per global batch, summed over all worker ranks, for every "
            f"layout: a record of layout {_either(_GROUPED)} holds several (the data set's "
            "`lmdbio.json` says how many), so each worker rank takes as many whole records "
            "as fit its share, rounded down with a warning (a share smaller than one record "
            f"is an error; {_either(layout_names(batch_per_record=True))}: exactly one record "
            "per worker rank).",
            minimum=1,
        ),
    )
    last: LastBatch = field(
        default="pad",
        metadata=_meta(
            "Policy for the last batch of an epoch when the record count is not a multiple of "
            "`size`.",
            choices={
                "pad": "fill it up by wrapping around to the first records of the epoch, so every "
                "rank gets the same number of full batches (no collective hangs)",
                "drop": "drop the incomplete batch on every rank",
                "partial": "deliver a smaller last batch (ranks may get different counts)",
            },
        ),
    )


@dataclass(frozen=True)
class ReadersConfig:
    """Which ranks read, and how they split the database."""

    strategy: str = field(
        default="dm-spec",
        metadata=_meta(
            "How reader ranks split the records of each iteration.",
            choices={name: cls.summary for name, cls in STRATEGIES.items()},
        ),
    )
    mode: ReaderMode = field(
        default="auto",
        metadata=_meta(
            "Whether a reader rank also trains.",
            choices={
                "auto": "colocated on nodes of fewer than 8 ranks and for GPU workers (a "
                "dedicated reader would idle a large share of the node, or a device); "
                "dedicated from 8 ranks per node",
                "dedicated": "readers only read; workers only consume (best overlap)",
                "colocated": "the first worker of a node also reads (small jobs, a single rank)",
            },
        ),
    )
    per_node: int = field(
        default=0,
        metadata=_meta(
            "Readers per node: the node's ranks are cut into this many groups of consecutive "
            "ranks (clamped to the node's ranks), each with its own reader and ring. One "
            "reader locates, fills and publishes every record its node's workers take; more "
            "spread that work when it paces the node (small records, many ranks). `mode` "
            "applies to each group. 0 chooses: a reader per rank on a colocated node "
            "(nobody waits for another rank's reader), one on a dedicated node. Only for a "
            f"node-level `strategy` ({_either(_NODE_LEVEL)}).", minimum=0
        ),
    )
    prefetch_depth: int = field(
        default=4,
        metadata=_meta(
            "Slots of the node's shared ring the reader may fill ahead of the consumers (each "
            "holds `batches_per_slot` batches).", minimum=1
        ),
    )
    batches_per_slot: int = field(
        default=0,
        metadata=_meta(
            "Consecutive batches a reader puts in one ring slot: the per-slot work (hand-off "
            "messages, checksums, validation, one decode call) is paid once for all of them. "
            "0 chooses: the fewest batches that reach 1,024 records per worker or 4 MiB of "
            "payload per slot, at most 16 (large records: one batch per slot); slots of "
            "record spans (`transfer` spans) instead aim at 4,096 records per worker, at "
            "most 64 batches and about 48 MiB of decoded float32 output per worker (from "
            "the file's bytes per record; ImageNet-sized batches of 32: two per slot), and "
            "at 16,384 records per worker, at most 1,024 batches and 64 MiB of the file "
            "per worker, "
            "where the workers assemble each batch as it is asked for (Caffe Datums on "
            "CPU workers).",
            minimum=0
        ),
    )
    checksum: SlotChecksum = field(
        default="xxh64",
        metadata=_meta(
            "Checksum of each worker's part of a node batch in shared memory: computed by the "
            "reader, verified by the worker before it reads (catches stray writes into the "
            "ring; costs a pass over the batch on each side). A colocated reader's own part "
            "is not checksummed: it never leaves the process.",
            choices={
                "xxh64": "XXH64 (compiled; the fastest)",
                "crc32": "zlib's CRC-32",
                "none": "no checksum (trusted nodes; the header keeps its own CRC)",
            },
        ),
    )
    transfer: Transfer = field(
        default="auto",
        metadata=_meta(
            "How a node's ring carries records from its reader to its workers.",
            choices={
                "auto": "spans where the layout allows it "
                f"({' and '.join(_SPANS)} without a codec), copy otherwise",
                "copy": "the reader copies each record's bytes into the ring slot (the slot "
                "checksum covers them)",
                "spans": "the slot carries each record's offset and length in the database "
                "file, which every rank of the node has mapped, and workers decode straight "
                "from the mapping: no copy, and the checksum covers only spans, labels and "
                f"keys ({' and '.join(_SPANS)} layouts without a codec; pays off for large "
                "records, see docs/service.md)",
            },
        ),
    )


@dataclass(frozen=True)
class ShuffleConfig:
    """The order records are visited in, per epoch (deterministic from `seed` and the epoch)."""

    mode: ShuffleMode = field(
        default="none",
        metadata=_meta(
            "Record order within an epoch. Shuffled modes need `readers.strategy: "
            f"{' | '.join(_SHUFFLING)}`.",
            choices={
                "none": "key order (the file order of a Caffe LMDB)",
                "global": "a full permutation of all records, seeded by (seed, epoch)",
                "block": "shuffle blocks of `block_pages` leaf pages, then shuffle records within "
                "a rolling window of `window` blocks (page-aware, far fewer random page reads)",
            },
        ),
    )
    seed: int = field(
        default=0,
        metadata=_meta("Seed of every random decision (order, crops, mirrors).", minimum=0),
    )
    block_pages: int = field(
        default=64, metadata=_meta("`block` mode: leaf pages per shuffled block.", minimum=1)
    )
    window: int = field(
        default=8,
        metadata=_meta(
            "`block` mode: consecutive blocks whose records are shuffled together.", minimum=1
        ),
    )


@dataclass(frozen=True)
class TransformConfig:
    """Caffe's `TransformationParameter`, applied by workers exactly as Caffe's
    `DataTransformer` does: `(pixel - mean) * scale`, then crop and mirror, to the batches
    of every image layout (see the rules across keys), as float32. With the defaults (the
    identity) Caffe Datums and PCR images are still widened to float32; tensor records
    keep their stored dtype."""

    scale: float = field(default=1.0, metadata=_meta("Multiplier applied after mean subtraction."))
    mean_values: tuple[float, ...] = field(
        default_factory=tuple,
        metadata=_meta(
            "Per-channel means to subtract: one value (used for every channel) or one per channel."
        ),
    )
    mean_file: str | None = field(
        default=None,
        metadata=_meta(
            "A Caffe `BlobProto` mean image (C, H, W) subtracted before cropping, at the crop "
            "offset. Resolved like `dataset.path`.",
            is_path=True,
        ),
    )
    crop_size: int = field(
        default=0,
        metadata=_meta(
            "Square crop side in pixels; 0 means no crop. Random offsets in `train`, centred in "
            "`test`.",
            minimum=0,
        ),
    )
    mirror: bool = field(
        default=False,
        metadata=_meta(
            "Mirror each image horizontally with probability 1/2 (in both phases, as Caffe does)."
        ),
    )
    phase: Phase = field(
        default="train",
        metadata=_meta(
            "Caffe phase: decides random versus centred crops.",
            choices={"train": "random crop offsets", "test": "centred crops"},
        ),
    )

    def active_keys(self) -> tuple[str, ...]:
        """The keys set to change the values (scale, means, crop, mirror), in schema
        order; none: the identity (``phase`` alone changes nothing)."""
        return tuple(k for k in _TRANSFORM_KEYS if getattr(self, k) != _TRANSFORM_DEFAULTS[k])


@dataclass(frozen=True)
class CodecConfig:
    """The batch codec used to move batches from readers to workers (and to GPUs).

    Every key of the `codec` section other than `name` is an option passed to the codec's
    `from_config`; options are checked by the codec itself when the job starts."""

    name: str = field(
        default="none",
        metadata=_meta(
            "Batch codec for transport through a node's ring (not among them, storage "
            f"layouts read as `dataset.layout`: {_code(_STORAGE_ONLY)}).",
            choices={name: BATCH_CODECS[name].summary for name in _TRANSPORT},
            refused=_STORAGE_ONLY,
        ),
    )
    options: tuple[tuple[str, Any], ...] = field(
        default_factory=tuple,
        metadata=_meta(
            "Codec options, written inline in the `codec` section (e.g. `chunk_bytes: 4`)."
        ),
    )

    def options_dict(self) -> dict[str, Any]:
        """The codec options as a plain dict (lists restored from tuples)."""
        return {k: _thaw(v) for k, v in self.options}


@dataclass(frozen=True)
class WorkersConfig:
    """Where workers put the batches they hand to the trainer."""

    device: Device = field(
        default="auto",
        metadata=_meta(
            "Device of delivered batches.",
            choices={
                "auto": "a GPU when cupy finds one, otherwise host memory",
                "cpu": "numpy arrays in host memory",
                "cuda": "cupy arrays on the rank's GPU (an error where there is none)",
            },
        ),
    )


@dataclass(frozen=True)
class TopologyConfig:
    """How ranks are grouped into nodes."""

    simulate_nodes: int | None = field(
        default=None,
        metadata=_meta(
            "Split the ranks of one host into this many simulated nodes (testing multi-node "
            "behaviour on one machine); 0 uses the real nodes. null (the default): the "
            "number `lmdbio launch --simulate-nodes K` exports to the ranks "
            "(`LMDBIO_SIMULATE_NODES`), else 0; a number set here wins over it.",
            minimum=0,
        ),
    )


@dataclass(frozen=True)
class MetricsConfig:
    """Counters every rank keeps (pages touched, prefetch hits, bytes moved, stalls)."""

    every: int = field(
        default=50,
        metadata=_meta("Report metrics every this many iterations; 0 only at the end.", minimum=0),
    )


@dataclass(frozen=True)
class ConfigOrigin:
    """Where a configuration's keys were written: its file and the line of each key path.

    Kept with the :class:`JobConfig` that :func:`load_config` returns so that a refusal made
    after loading (the run plan's, which needs the topology) points at the line to change,
    as the loader's own refusals do."""

    #: the YAML file the configuration was read from (None: a mapping, or built in code)
    filename: str | None = None
    #: dotted key path (``batch.size``, ``readers``) -> line where that key was written
    lines: Mapping[str, int] = field(default_factory=dict)

    def location(self, path: str) -> str | None:
        """``file:line`` of key path ``path``, else of the nearest section above it that
        was written (a default has no line of its own); None where neither was."""
        parts = path.split(".")
        while parts:
            line = self.lines.get(".".join(parts))
            if line is not None:
                return f"{self.filename or '<config>'}:{line}"
            parts.pop()
        return None


@dataclass(frozen=True)
class JobConfig:
    """A complete, validated data-loading job."""

    #: where the keys were written (set by :func:`load_config`; not a setting, not compared)
    origin: ClassVar[ConfigOrigin] = ConfigOrigin()

    dataset: DatasetConfig = field(
        metadata=_meta("Where the records are and how they are laid out.")
    )
    batch: BatchConfig = field(default_factory=BatchConfig, metadata=_meta("The global batch."))
    readers: ReadersConfig = field(
        default_factory=ReadersConfig, metadata=_meta("Reader ranks and strategy.")
    )
    shuffle: ShuffleConfig = field(default_factory=ShuffleConfig, metadata=_meta("Epoch order."))
    transform: TransformConfig = field(
        default_factory=TransformConfig, metadata=_meta("Caffe DataTransformer parameters.")
    )
    codec: CodecConfig = field(
        default_factory=CodecConfig, metadata=_meta("Batch codec for transport.")
    )
    workers: WorkersConfig = field(default_factory=WorkersConfig, metadata=_meta("Worker ranks."))
    topology: TopologyConfig = field(
        default_factory=TopologyConfig, metadata=_meta("Node grouping.")
    )
    epochs: int = field(default=1, metadata=_meta("Number of passes over the data set.", minimum=1))
    max_iterations: int = field(
        default=0,
        metadata=_meta(
            "Stop after this many iterations in all, counted across epochs, as Caffe's "
            "solver max_iter does: the epoch it falls in ends there and the readers read "
            "nothing past it (the job ends at whichever of epochs and max_iterations comes "
            "first). A resumed job counts the iterations it ran before. It applies where "
            "the epochs come from loader.epochs() (lmdbio run, the Caffe-style trainer). "
            "0: every epoch runs whole.",
            minimum=0,
        ),
    )
    on_error: OnError = field(
        default="raise",
        metadata=_meta(
            "What to do with a record that cannot be decoded.",
            choices={
                "raise": "stop the job with an error naming the key",
                "skip": "leave the record out and count it in the metrics",
                "substitute": "replace it with a valid record of the same batch, keeping the "
                "batch size, and count it in the metrics",
            },
        ),
    )
    metrics: MetricsConfig = field(
        default_factory=MetricsConfig, metadata=_meta("Metrics reporting.")
    )

    def to_dict(self) -> dict[str, Any]:
        """A plain nested mapping (lists, not tuples; codec options inline) such that
        ``load_config(cfg.to_dict()) == cfg``."""
        return _to_dict(self)


# ---------------------------------------------------------------------------------------------
# problems and errors


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration."""

    path: str  #: dotted key path, e.g. ``batch.last``
    message: str  #: what is wrong and what is allowed
    location: str | None = None  #: ``file:line`` where the key was written, when known

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        return f"{where}{self.path}: {self.message}"


def _problems_error(problems: list[ConfigProblem], source: str | None) -> ConfigError:
    """One :class:`ConfigError` listing ``problems`` (its ``problems`` and ``path``
    attributes hold them and the first one's key path)."""
    head = f"invalid job configuration{f' {source}' if source else ''}"
    if len(problems) == 1:
        err = ConfigError(f"{head}: {problems[0]}")
    else:
        lines = "\n".join(f"  - {p}" for p in problems)
        err = ConfigError(f"{head} ({len(problems)} problems):\n{lines}")
    err.problems = problems  # type: ignore[attr-defined]
    err.path = problems[0].path  # type: ignore[attr-defined]
    return err


def _raise_problems(problems: list[ConfigProblem], source: str | None) -> None:
    if problems:
        raise _problems_error(problems, source)


def setting_error(origin: ConfigOrigin, path: str, message: str) -> ConfigError:
    """The error refusing the value of setting ``path`` for a reason found after loading
    (with the topology, the data set's sidecar or its size), in :func:`load_config`'s form:
    the file and line where the key was written (its section's where it was not; from
    ``origin``, a :attr:`JobConfig.origin`), the key path, then ``message`` (what is wrong
    and what to set)."""
    problem = ConfigProblem(path, message, origin.location(path))
    return _problems_error([problem], origin.filename)


# ---------------------------------------------------------------------------------------------
# YAML with line numbers and duplicate-key detection


class _LocatedDict(dict):
    """A mapping read from YAML that remembers the line of each key."""

    lines: dict[str, int]


def _yaml_loader(filename: str) -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> _LocatedDict:
        loader.flatten_mapping(node)
        out = _LocatedDict()
        out.lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise ConfigError(
                    f"{filename}:{key_node.start_mark.line + 1}: a mapping key must be a scalar"
                ) from None
            if key in out:
                raise ConfigError(
                    f"{filename}:{key_node.start_mark.line + 1}: duplicate key {key!r} "
                    f"(first at line {out.lines[key]})"
                )
            out[key] = loader.construct_object(value_node, deep=True)
            out.lines[key] = key_node.start_mark.line + 1
        return out

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return Loader


def _parse_yaml(text: str, filename: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader(filename))  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        raise ConfigError(f"{where}: YAML syntax error: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{filename}: YAML error: {exc}") from None


# ---------------------------------------------------------------------------------------------
# building dataclasses from raw mappings


class _Ctx:
    """State of one validation pass: where raw values came from and what went wrong."""

    def __init__(self, filename: str | None, base_dir: Path | None) -> None:
        self.filename = filename
        self.base_dir = base_dir
        self.problems: list[ConfigProblem] = []
        self.path_bases: dict[str, Path | None] = {}

    def add(self, path: str, message: str, owner: object = None, key: object = None) -> None:
        location = None
        lines = getattr(owner, "lines", None)
        if lines and key in lines:
            location = f"{self.filename or '<config>'}:{lines[key]}"
        self.problems.append(ConfigProblem(path, message, location))


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, str):
        return f"string {value!r}"
    return f"{type(value).__name__} {value!r}"


def _is_optional(tp: Any) -> tuple[bool, Any]:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def _allowed(tp: Any, meta: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The values a field of closed choices accepts: a ``Literal``'s, or those a string
    field's metadata lists (the names of a registry); None for any other field."""
    _, inner = _is_optional(tp)
    if get_origin(inner) is Literal:
        return get_args(inner)
    if inner is str and meta.get("choices"):
        return tuple(meta["choices"])
    return None


def _type_text(tp: Any, meta: Mapping[str, Any] | None = None) -> str:
    """Human (and Markdown) description of a schema type."""
    optional, inner = _is_optional(tp)
    allowed = _allowed(tp, meta or {})
    if allowed is not None:
        text = "one of " + ", ".join(f"`{a}`" for a in allowed)
    elif inner is bool:
        text = "boolean"
    elif inner is int:
        text = "integer"
    elif inner is float:
        text = "number"
    elif inner is str:
        text = "string"
    elif get_origin(inner) is tuple:
        text = "list of numbers"
    elif dataclasses.is_dataclass(inner):
        text = "mapping"
    else:  # pragma: no cover - every schema type is listed above
        text = str(inner)
    return f"{text} or null" if optional else text


class _Key:
    """A key being checked: its dotted path, and the mapping and key its line is kept under
    (``owner.lines[key]``), so that a refusal names both."""

    def __init__(self, path: str, ctx: _Ctx, owner: object, key: object) -> None:
        self.path, self.ctx, self.owner, self.key = path, ctx, owner, key

    def refuse(self, message: str, path: str | None = None) -> tuple[bool, Any]:
        """Record a problem with this key (or with ``path`` inside it); ``(False, None)``."""
        self.ctx.add(path or self.path, message, self.owner, self.key)
        return False, None


def _coerce(
    tp: Any, value: Any, meta: Mapping[str, Any], path: str, ctx: _Ctx, owner: object,
    key: object,
) -> tuple[bool, Any]:
    """Check ``value`` against ``tp``; return (ok, converted value)."""
    site = _Key(path, ctx, owner, key)
    optional, inner = _is_optional(tp)
    if value is None:
        if optional:
            return True, None
        return site.refuse(f"must be {_type_text(tp, meta)}, not null")
    allowed = _allowed(tp, meta)
    if allowed is not None:
        return _coerce_choice(value, allowed, site, meta.get("refused") or {})
    if inner is bool:
        if isinstance(value, bool):
            return True, value
        return site.refuse(f"must be a boolean (true or false), not {_describe(value)}")
    if inner in (int, float):
        return _coerce_number(inner, value, meta.get("minimum"), site)
    if inner is str:
        return _coerce_text(value, site)
    if get_origin(inner) is tuple:
        return _coerce_numbers(value, site)
    raise TypeError(f"unsupported schema type {tp!r}")  # pragma: no cover - all handled above


def _coerce_choice(value: Any, allowed: tuple[str, ...], site: _Key,
                   refused: Mapping[str, str]) -> tuple[bool, Any]:
    """One of the names ``allowed``; a refusal gives the reason for a name ``refused``
    holds, else suggests the closest name or says to quote a word YAML read as a boolean."""
    if isinstance(value, str) and value in allowed:
        return True, value
    return site.refuse(_choice_refusal(value, allowed, refused))


def _choice_refusal(value: Any, allowed: tuple[str, ...], refused: Mapping[str, str]) -> str:
    """Why ``value`` is not one of ``allowed`` (see :func:`_coerce_choice`)."""
    hint = ""
    if isinstance(value, str) and value in refused:
        hint = f"; {refused[value]}"
    elif isinstance(value, str):
        close = difflib.get_close_matches(value, allowed, n=1, cutoff=0.5)
        if close:
            hint = f"; did you mean {close[0]!r}?"
    elif isinstance(value, bool):
        hint = " (YAML reads yes/no/on/off as booleans: quote the value)"
    return f"{_describe(value)} is not allowed; allowed: {', '.join(allowed)}{hint}"


def _coerce_number(inner: type, value: Any, minimum: Any, site: _Key) -> tuple[bool, Any]:
    """An integer (``inner`` int) or a finite number (float), at least ``minimum`` where the
    field has one; a boolean is neither."""
    if inner is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return site.refuse(f"must be an integer, not {_describe(value)}")
        out: Any = int(value)
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return site.refuse(f"must be a number, not {_describe(value)}")
        out = float(value)
        if not math.isfinite(out):
            return site.refuse(f"must be a finite number, not {value!r}")
    if minimum is not None and out < minimum:
        return site.refuse(f"must be >= {minimum}, not {value!r}")
    return True, out


def _coerce_text(value: Any, site: _Key) -> tuple[bool, Any]:
    """A non-empty string."""
    if not isinstance(value, str):
        return site.refuse(f"must be a string, not {_describe(value)}")
    if not value:
        return site.refuse("must not be empty")
    return True, value


def _coerce_numbers(value: Any, site: _Key) -> tuple[bool, Any]:
    """A list of finite numbers, as a tuple of floats; the first bad item is named by its
    index (``transform.mean_values[1]``)."""
    if not isinstance(value, (list, tuple)):
        return site.refuse(
            f"must be a list of numbers (e.g. [104, 117, 123]), not {_describe(value)}"
        )
    for i, item in enumerate(value):
        if (
            isinstance(item, bool)
            or not isinstance(item, (int, float))
            or not math.isfinite(float(item))
        ):
            where = f"{site.path}[{i}]"
            return site.refuse(f"must be a finite number, not {_describe(item)}", where)
    return True, tuple(float(item) for item in value)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _resolve_path(value: str, base: Path | None) -> str:
    p = Path(os.path.expanduser(value))
    if not p.is_absolute() and base is not None:
        p = base / p
    if p.is_absolute():
        return os.path.normpath(p)  # lexical: symlinks are kept as the user wrote them
    return value


def _build(
    cls: type, raw: Any, prefix: str, ctx: _Ctx, owner: object = None, owner_key: object = None
) -> Any:
    """Validate ``raw`` (a mapping) against dataclass ``cls``; None if anything is wrong."""
    if not isinstance(raw, Mapping):
        ctx.add(
            prefix or "<top level>",
            f"must be a mapping of keys, not {_describe(raw)}",
            owner,
            owner_key,
        )
        return None
    flds = {f.name: f for f in dataclasses.fields(cls) if f.name != "options"}
    keys_ok, extra = _check_keys(cls, raw, prefix, ctx, flds)
    values_ok, values = _field_values(cls, raw, prefix, ctx, flds, owner, owner_key)
    ok = keys_ok and values_ok
    if cls is CodecConfig:
        options_ok, values["options"] = _codec_options(extra, raw, prefix, ctx)
        ok = ok and options_ok
    if not ok:
        return None
    return cls(**values)


def _check_keys(
    cls: type, raw: Mapping[Any, Any], prefix: str, ctx: _Ctx, names: Mapping[str, Any]
) -> tuple[bool, dict[str, Any]]:
    """Refuse the keys of ``raw`` that are not strings or not among ``names`` (the fields of
    ``cls``; the closest one suggested). A codec section's other keys are its options:
    returned, with False where a key was refused."""
    ok = True
    extra: dict[str, Any] = {}
    for key in raw:
        if not isinstance(key, str):
            ctx.add(
                _join(prefix, str(key)), f"keys must be strings, not {_describe(key)}", raw, key
            )
            ok = False
        elif key not in names:
            if cls is CodecConfig:
                extra[key] = raw[key]
                continue
            close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            ctx.add(
                _join(prefix, key),
                f"unknown key; {hint}allowed keys here: {', '.join(names)}",
                raw,
                key,
            )
            ok = False
    return ok, extra


def _field_values(
    cls: type,
    raw: Mapping[Any, Any],
    prefix: str,
    ctx: _Ctx,
    flds: Mapping[str, dataclasses.Field],
    owner: object,
    owner_key: object,
) -> tuple[bool, dict[str, Any]]:
    """The checked value of each field of ``cls`` that ``raw`` sets (a section built in
    turn); False where one is wrong or a required one is missing."""
    hints = typing.get_type_hints(cls)
    ok = True
    values: dict[str, Any] = {}
    for name, f in flds.items():
        path = _join(prefix, name)
        tp = hints[name]
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                if dataclasses.is_dataclass(tp):
                    ctx.add(path, "required section missing", owner, owner_key)
                else:
                    ctx.add(path, "required key missing", raw, None)
                ok = False
            continue
        good, value = _field_value(tp, f, raw, name, path, ctx)
        if good:
            values[name] = value
        else:
            ok = False
    return ok, values


def _field_value(
    tp: Any, f: dataclasses.Field, raw: Mapping[Any, Any], name: str, path: str, ctx: _Ctx
) -> tuple[bool, Any]:
    """``raw[name]`` checked as field ``f`` of type ``tp``: a section built, a value
    converted (a path resolved against the folder it is relative to)."""
    value = raw[name]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        built = _build(tp, value, path, ctx, raw, name)
        return built is not None, built
    good, converted = _coerce(tp, value, f.metadata, path, ctx, raw, name)
    if good and f.metadata.get("is_path") and converted is not None:
        converted = _resolve_path(converted, ctx.path_bases.get(path, ctx.base_dir))
    return good, converted


def _codec_options(
    extra: Mapping[str, Any], raw: Mapping[Any, Any], prefix: str, ctx: _Ctx
) -> tuple[bool, tuple[tuple[str, Any], ...]]:
    """A codec section's options (its keys other than ``name``): identifiers with plain
    values, frozen and sorted; False where one is refused."""
    ok = True
    for key, value in extra.items():
        if not key.isidentifier():
            ctx.add(_join(prefix, key), "codec option names must be identifiers", raw, key)
            ok = False
        elif not _plain_value(value):
            ctx.add(
                _join(prefix, key),
                "codec options must be numbers, strings, booleans, "
                f"null or lists of those, not {_describe(value)}",
                raw,
                key,
            )
            ok = False
    return ok, tuple(sorted((k, _freeze(v)) for k, v in extra.items()))


def _plain_value(value: object) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(v is None or isinstance(v, (bool, int, float, str)) for v in value)
    return False


def _key_lines(raw: Mapping[Any, Any], prefix: str = "") -> dict[str, int]:
    """Dotted key path -> line, for every key of ``raw`` (and of its sections) read from
    YAML (see :class:`_LocatedDict`); a plain mapping has none."""
    lines = getattr(raw, "lines", {})
    out: dict[str, int] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            continue
        path = _join(prefix, key)
        if key in lines:
            out[path] = lines[key]
        if isinstance(value, Mapping):
            out.update(_key_lines(value, path))
    return out


class _Problems(list[ConfigProblem]):
    """Problems of one configuration, each located where its key (or section) was written."""

    def __init__(self, origin: ConfigOrigin) -> None:
        super().__init__()
        self.origin = origin

    def add(self, path: str, message: str, at: str | None = None) -> None:
        """A problem with key ``path``, at the line of key path ``at`` (default: ``path``)."""
        self.append(ConfigProblem(path, message, self.origin.location(at or path)))


def was_loaded(cfg: JobConfig) -> bool:
    """Whether ``cfg`` is what :func:`load_config` returned, every key and combination
    checked as it was read (it sets the instance's own :attr:`JobConfig.origin`; a config
    built in code, or a ``dataclasses.replace`` of a loaded one, has the class's)."""
    return "origin" in vars(cfg)


def check_combinations(cfg: JobConfig) -> None:
    """Refuse the combinations of ``cfg`` that each key allows alone but not together (what
    :func:`load_config` checks after the keys; for a :class:`JobConfig` built in code),
    every problem at its line where ``cfg`` came from a file. Its closed choices first
    (load_config refuses them as it reads each key; built in code, nothing has yet)."""
    choices = _Problems(cfg.origin)
    _check_choices(cfg, choices)
    # a name outside a registry's allowed ones: the rules across keys would fail on it
    _raise_problems(choices or _combination_problems(cfg), cfg.origin.filename)


def _combination_problems(cfg: JobConfig) -> list[ConfigProblem]:
    """Cross-field rules: combinations each key allows alone but not together."""
    problems = _Problems(cfg.origin)
    _check_transport(cfg, problems)
    t = cfg.transform
    if t.mean_values and t.mean_file is not None:
        problems.add(
            "transform.mean_file",
            "cannot be set together with transform.mean_values "
            "(Caffe allows one or the other); remove one of them",
        )
    if cfg.shuffle.mode != "none" and not STRATEGIES[cfg.readers.strategy].shuffles:
        shuffling = " | ".join(_SHUFFLING)
        problems.add(
            "shuffle.mode",
            f"{cfg.shuffle.mode!r} needs readers.strategy: {shuffling} "
            f"(strategy {cfg.readers.strategy!r} reads records in file order and cannot "
            f"shuffle); set readers.strategy: {shuffling} or shuffle.mode: none",
        )
    layout = LAYOUTS[cfg.dataset.layout]
    if cfg.dataset.scan_groups is not None and not layout.progressive:
        problems.add(
            "dataset.scan_groups",
            f"only applies to dataset.layout: {' | '.join(_PROGRESSIVE)} (layout is "
            f"{cfg.dataset.layout!r}); remove it",
        )
    if not layout.image:  # the loader applies the transform to image batches only
        for key in t.active_keys():
            problems.add(
                f"transform.{key}",
                f"needs image records (dataset.layout one of {', '.join(_IMAGES)}); layout "
                f"{cfg.dataset.layout!r} holds table rows, which the transform would leave "
                "as they are: remove it",
            )
    if cfg.codec.name == "none" and cfg.codec.options:
        names = ", ".join(k for k, _ in cfg.codec.options)
        problems.add(
            "codec",
            f"options ({names}) given but codec.name is 'none'; set codec.name "
            "or remove the options",
            at=f"codec.{cfg.codec.options[0][0]}",
        )
    return problems


def _check_choices(cfg: JobConfig, problems: _Problems) -> None:
    """The closed choices of a :class:`JobConfig` built in code (:func:`load_config` checks
    them as it reads each key), refused as :func:`load_config` refuses them."""
    for path, tp, f, value in _settings(cfg):
        allowed = _allowed(tp, f.metadata)
        if allowed is not None and value is not None and value not in allowed:
            problems.add(path, _choice_refusal(value, allowed, f.metadata.get("refused") or {}))


def _settings(obj: Any, prefix: str = "") -> Iterable[tuple[str, Any, dataclasses.Field, Any]]:
    """``(key path, type, field, value)`` of every setting of ``obj`` (a config dataclass),
    its sections' settings in turn."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _settings(value, _join(prefix, f.name))
        else:
            yield _join(prefix, f.name), hints[f.name], f, value


def _check_transport(cfg: JobConfig, problems: _Problems) -> None:
    """Rules of how a node's ring carries records (``codec``, ``readers``) that the loader
    would otherwise refuse only when the job starts."""
    codec, strategy = cfg.codec.name, cfg.readers.strategy
    if codec != "none" and not STRATEGIES[strategy].shared:
        problems.add(
            "codec.name",
            f"{codec!r} compresses the batches of a node's ring: it needs a node-level "
            f"readers.strategy: {' | '.join(_NODE_LEVEL)} (strategy {strategy!r} has no "
            "ring); set readers.strategy: dm-spec or codec.name: none",
        )
    if cfg.readers.per_node and not STRATEGIES[strategy].shared:
        problems.add(
            "readers.per_node",
            f"{cfg.readers.per_node} groups a node's ranks around readers, which a "
            f"node-level readers.strategy has ({' | '.join(_NODE_LEVEL)}); strategy "
            f"{strategy!r} has none (every rank reads for itself), so it would have no "
            "effect: remove readers.per_node or set readers.strategy: dm-spec",
        )
    as_stored = LAYOUTS[cfg.dataset.layout].spans and codec == "none"
    if cfg.readers.transfer == "spans" and not as_stored:
        problems.add(
            "readers.transfer",
            f"spans hands out records as they are stored (dataset.layout "
            f"{' | '.join(_SPANS)} and codec.name none); this job has layout "
            f"{cfg.dataset.layout!r} and codec {codec!r}: set readers.transfer: copy or auto",
        )


# ---------------------------------------------------------------------------------------------
# overrides


def _parse_override(item: str) -> tuple[list[str], Any]:
    import yaml

    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key.path=value")
    key, _, text = item.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {item!r}: empty key in {key!r}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
    return parts, value


def _apply_override(raw: dict, parts: list[str], value: Any, item: str) -> None:
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = {}
            node[part] = child
        elif not isinstance(child, Mapping):
            raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is not a section")
        elif not isinstance(child, dict):
            child = dict(child)
            node[part] = child
        node = child
    node[parts[-1]] = value


def _copy_raw(raw: Mapping) -> dict:
    out = _LocatedDict()
    out.lines = dict(getattr(raw, "lines", {}))
    for k, v in raw.items():
        out[k] = _copy_raw(v) if isinstance(v, Mapping) else v
    return out


# ---------------------------------------------------------------------------------------------
# public API


def load_config(
    source: str | os.PathLike | Mapping[str, Any] | JobConfig,
    overrides: Iterable[str] = (),
    *,
    base_dir: str | os.PathLike | None = None,
) -> JobConfig:
    """Read, merge and validate a job configuration.

    ``source`` is a YAML file path, a mapping (as YAML would give), or a :class:`JobConfig`.
    ``overrides`` are ``key.path=value`` strings applied on top, each value parsed as YAML
    (``batch.size=128``, ``transform.mean_values=[104,117,123]``, ``dataset.subdb=null``).
    Relative paths (``dataset.path``, ``transform.mean_file``) written in a file resolve
    against the file's folder; in a mapping against ``base_dir`` when given (else they are
    kept as written); in an override against the working directory.

    Raises :class:`~lmdbio.errors.ConfigError` listing every problem found (its ``problems``
    attribute holds :class:`ConfigProblem` items). The result's :attr:`JobConfig.origin`
    says where its keys were written (a :class:`JobConfig` source keeps its own).
    """
    base = Path(base_dir) if base_dir is not None else None
    raw, origin, base = _read_source(source, base)
    filename = origin.filename
    ctx = _Ctx(filename, base)
    if not isinstance(raw, Mapping):
        ctx.add("<top level>", f"a job config must be a mapping of sections, not {_describe(raw)}")
        _raise_problems(ctx.problems, filename)
    raw = _copy_raw(raw)
    _apply_overrides(raw, overrides, ctx)
    cfg = _build(JobConfig, raw, "", ctx)
    if cfg is not None:
        lines = {**origin.lines, **_key_lines(raw)}
        object.__setattr__(cfg, "origin", ConfigOrigin(filename, lines))
        ctx.problems += _combination_problems(cfg)
    _raise_problems(ctx.problems, filename)
    assert cfg is not None
    return cfg


def _read_source(
    source: str | os.PathLike | Mapping[str, Any] | JobConfig, base: Path | None
) -> tuple[Any, ConfigOrigin, Path | None]:
    """``(raw mapping, origin, base folder)`` of a :func:`load_config` source: a file's
    YAML (its folder the base, unless one is given), a mapping as it is, a
    :class:`JobConfig` as its :meth:`~JobConfig.to_dict` (keeping where its keys were
    written)."""
    if isinstance(source, JobConfig):
        return source.to_dict(), source.origin, base
    if isinstance(source, Mapping):
        return source, ConfigOrigin(), base
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"config source must be a file path, a mapping or a JobConfig, not "
            f"{type(source).__name__}"
        )
    p = Path(source)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config file ({exc})") from None
    raw = _parse_yaml(text, str(p))
    folder = base if base is not None else p.resolve().parent
    return ({} if raw is None else raw), ConfigOrigin(str(p)), folder


def _apply_overrides(raw: dict, overrides: Iterable[str], ctx: _Ctx) -> None:
    """Apply ``key.path=value`` overrides to ``raw``; a path in one (or in a section one
    replaces) resolves against the working directory."""
    for item in overrides:
        parts, value = _parse_override(item)
        _apply_override(raw, parts, value, item)
        dotted = ".".join(parts)
        ctx.path_bases[dotted] = Path.cwd()
        if isinstance(value, Mapping):  # a whole section replaced: its paths are cwd-relative
            for k in value:
                ctx.path_bases[f"{dotted}.{k}"] = Path.cwd()


def _to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(obj, CodecConfig) and f.name == "options":
                out.update(obj.options_dict())
            else:
                out[f.name] = _to_dict(value)
        return out
    if isinstance(obj, tuple):
        return [_to_dict(v) for v in obj]
    return obj


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        return "**required**"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return "`[]`" if not value else f"`{list(value)}`"
    return f"`{value}`"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_reference() -> str:
    """The Markdown reference of every key (type, default, allowed values, meaning), generated
    from the schema; ``docs/configuration.md`` is this text (a test keeps them equal)."""
    lines = _render_intro()
    hints = typing.get_type_hints(JobConfig)
    top_scalars = []
    for f in dataclasses.fields(JobConfig):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            lines += _render_section(f.name, tp, f.metadata["doc"])
        else:
            top_scalars.append(f)
    lines += _render_top_level(top_scalars, hints)
    lines += _render_rules()
    lines += ["## Defaults in full", "", "```yaml", *_yaml_defaults(), "```", ""]
    return "\n".join(lines)


def _render_intro() -> list[str]:
    """The reference's title and how a job is read (sources, overrides, paths)."""
    return [
        "# Job configuration reference",
        "",
        "<!-- GENERATED by lmdbio.config.render_reference(); do not edit by hand. Regenerate "
        "with `python -m lmdbio.config > docs/configuration.md`. -->",
        "",
        "A job is a YAML file read by `lmdbio run CONFIG.yaml` and `loaders.open(CONFIG)` "
        "through `lmdbio.config.load_config(source, overrides)`. Only `dataset.path` is "
        "required. Unknown keys, wrong types, values outside the allowed set and impossible "
        "combinations are errors that name the key path (and the file and line) and what is "
        "allowed; a misspelt key gets the closest valid name suggested.",
        "",
        "Overrides: `key.path=value`, the value parsed as YAML, e.g. "
        "`batch.size=128 shuffle.mode=global readers.strategy=indexed "
        "transform.mean_values=[104,117,123]`.",
        "",
        "Paths (`dataset.path`, `transform.mean_file`): relative paths in a file resolve "
        "against the file's folder; in an override, against the working directory.",
        "",
    ]


def _render_top_level(flds: list[dataclasses.Field], hints: Mapping[str, Any]) -> list[str]:
    """The table of the top-level keys (not sections), then their choices."""
    lines = ["## Top-level keys", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for f in flds:
        lines.append(
            f"| `{f.name}` | {_md_cell(_field_type_text(f, hints[f.name]))} | "
            f"{_default_text(f)} | {_md_cell(f.metadata['doc'])} |"
        )
    lines.append("")
    for f in flds:
        lines += _render_choices(f.name, f.metadata)
    return lines


def _render_rules() -> list[str]:
    """The rules across keys (:func:`_combination_problems`), in words."""
    return [
        "## Rules across keys",
        "",
        "- `transform.mean_values` and `transform.mean_file` cannot both be set.",
        "- `shuffle.mode` other than `none` needs `readers.strategy: "
        + " | ".join(_SHUFFLING)
        + "`.",
        "- `dataset.scan_groups` only applies to `dataset.layout: "
        + " | ".join(_PROGRESSIVE)
        + "`.",
        "- a transform (" + _code(f"transform.{key}" for key in _TRANSFORM_KEYS) + ") "
        "needs image records, to whose batches the workers apply it: `dataset.layout` one "
        "of " + _code(_IMAGES) + ".",
        "- codec options need a `codec.name` other than `none`.",
        "- `codec.name` is a transport codec: one of " + _code(_TRANSPORT) + " (the others "
        "are storage layouts: `dataset.layout`); a codec other than `none` needs a "
        "node-level `readers.strategy`: " + _code(_NODE_LEVEL) + ".",
        "- `readers.per_node` other than 0 needs a node-level `readers.strategy`: "
        + _code(_NODE_LEVEL) + ".",
        "- `readers.transfer: spans` needs `dataset.layout` one of " + _code(_SPANS)
        + " and `codec.name: none`.",
        "- `transform.mean_values` holds one value or one per channel (checked against the "
        "data when the job starts).",
        "",
    ]


#: the transform's keys that change the values (``phase`` alone changes nothing)
_TRANSFORM_KEYS = tuple(f.name for f in dataclasses.fields(TransformConfig) if f.name != "phase")
#: their defaults (the identity)
_TRANSFORM_DEFAULTS = {k: getattr(TransformConfig(), k) for k in _TRANSFORM_KEYS}


def _field_type_text(f: dataclasses.Field, tp: Any) -> str:
    text = _type_text(tp, f.metadata)
    if f.metadata.get("minimum") is not None:
        text += f", >= {f.metadata['minimum']}"
    if f.metadata.get("is_path"):
        text += " (path)"
    return text


def _render_section(name: str, cls: type, doc: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    lines = [
        f"## `{name}`",
        "",
        _md_cell(" ".join((cls.__doc__ or doc).split())),
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for f in dataclasses.fields(cls):
        key = f"{name}.{f.name}" if f.name != "options" else f"{name}.<option>"
        if f.name == "options":
            tp_text = "any scalar or list"
        else:
            tp_text = _field_type_text(f, hints[f.name])
        default = "none" if f.name == "options" else _default_text(f)
        lines.append(
            f"| `{key}` | {_md_cell(tp_text)} | {default} | {_md_cell(f.metadata['doc'])} |"
        )
    lines.append("")
    for f in dataclasses.fields(cls):
        lines += _render_choices(f"{name}.{f.name}", f.metadata)
    return lines


def _render_choices(key: str, meta: Mapping[str, Any]) -> list[str]:
    choices = meta.get("choices") or {}
    if not choices:
        return []
    lines = [f"`{key}`:", ""]
    lines += [f"- `{value}`: {text}" for value, text in choices.items()]
    lines.append("")
    return lines


def _yaml_defaults() -> list[str]:
    import yaml

    defaults: dict[str, Any] = {"dataset": {"path": "PATH/TO/LMDB"}}
    hints = typing.get_type_hints(JobConfig)
    for f in dataclasses.fields(JobConfig):
        tp = hints[f.name]
        if f.name == "dataset":
            for g in dataclasses.fields(DatasetConfig):
                if g.default is not dataclasses.MISSING:
                    defaults["dataset"][g.name] = g.default
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            defaults[f.name] = _to_dict(tp())
        else:
            defaults[f.name] = f.default
    return yaml.safe_dump(defaults, sort_keys=False, default_flow_style=False).splitlines()


if __name__ == "__main__":  # pragma: no cover - the regeneration command of the reference
    import sys

    sys.stdout.write(render_reference())
