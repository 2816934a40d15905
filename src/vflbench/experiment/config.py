"""Experiment configuration: strict YAML schema, ``--set`` overrides, resolution, hashing."""

from __future__ import annotations

import copy
import hashlib
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vflbench.devices import check_device, resolve_device
from vflbench.errors import ConfigError, DataError
from vflbench.registry import closest_name

Algorithm = Literal["vlr", "vhnn", "vsnn"]
Aggregation = Literal["concat", "sum", "mean"]
AGGREGATIONS: dict[str, tuple[Aggregation, ...]] = {
    "vlr": ("sum",),
    "vhnn": ("concat", "sum", "mean"),
    "vsnn": ("concat", "sum", "mean"),
}
DEFAULT_MODELS = {"vlr": ("logreg", "identity"), "vhnn": ("mlp2", "mlp2"), "vsnn": ("mlp2", "mlp2")}
#: The widest bottom output a config may ask for (the same bound the network protocol checks): wider
#: than any model of the papers (a flattened VGG/ResNet feature map is at most 65,536 values), small
#: enough that a typo (an extra digit or three) fails here with a message instead of in the allocator.
MAX_EMBED_DIM = 1 << 20
#: Seeds are integers in [0, MAX_SEED]: what numpy's seeding accepts and what a results table's
#: 64-bit integer column holds, with room to spare.
MAX_SEED = 2**32 - 1


#: What a run computes from a config, as a version: bumped whenever the same config would give other results
#: (a method's default changed, a scoring or selection rule changed). It is part of every config hash, so a sweep
#: or an undefended reference never reuses a result computed under older rules, and ``result.json`` records it as
#: ``schema_version``. 2: issue 24 (selection ``last``, priors floored at a constant guess, repeats and intervals,
#: the held-out auxiliary pool).
RESULTS_VERSION = 2


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class DataConfig(_Strict):
    """Which dataset, how it is cut among parties, and how much of it to use."""

    name: str
    parties: int = Field(2, description="number of parties K, the active party included (2..10)")
    root: str | None = Field(None, description="datasets root (else --data-root or $VFLBENCH_DATA)")
    split: Literal["auto", "width", "height", "even", "columns"] = "auto"
    columns: list[list[int]] | None = Field(None, description="explicit column lists, passive parties first")
    standardise: bool = True
    train_size: int | None = Field(None, description="subsample this many training rows")
    test_size: int | None = Field(None, description="subsample this many test rows")
    aux_pool: int | float = Field(
        0,
        description="training rows held out of every party's training as the "
        "auxiliary pool that attacks and defenses with auxiliary sets disjoint from the "
        "training set draw from: a share in [0, 0.5] or a row count (0: none)",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="dataset-specific options")

    @field_validator("aux_pool")
    @classmethod
    def _check_pool(cls, value: int | float) -> int | float:
        if isinstance(value, bool) or value < 0 or (isinstance(value, float) and value > 0.5):
            raise ValueError(
                f"aux_pool is a share of the training rows in [0, 0.5] (e.g. 0.1) or a row count (e.g. "
                f"640), got {value!r}"
            )
        return value


class ModelConfig(_Strict):
    """Bottom and top model names and sizes."""

    bottom: str | None = Field(None, description="bottom model of every party (default per algorithm)")
    top: str | None = Field(None, description="top model (default per algorithm)")
    embed_dim: int | None = Field(
        None,
        ge=1,
        le=MAX_EMBED_DIM,
        description=f"bottom output width, 1..{MAX_EMBED_DIM} (default 16; classes in VLR)",
    )
    bottom_options: dict[str, Any] = Field(default_factory=dict)
    top_options: dict[str, Any] = Field(default_factory=dict)


class TrainConfig(_Strict):
    """The VFL algorithm and its optimisation."""

    algorithm: Algorithm = "vhnn"
    aggregation: Literal["concat", "sum", "mean"] | None = None
    epochs: int = Field(10, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(0.1, gt=0)
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(0.9, ge=0, description="SGD momentum (0.9 as in Fu et al.)")
    weight_decay: float = Field(0.0, ge=0)
    schedule: Literal["constant", "step", "multistep", "cosine"] = "constant"
    step_size: int = Field(30, ge=1)
    milestones: list[int] = Field(default_factory=list)
    gamma: float = Field(0.1, gt=0)
    metric: Literal["accuracy", "auc"] = "accuracy"
    eval_every: int = Field(1, ge=1)
    threads: int = Field(1, ge=1, description="torch intra-op threads (1 is fastest for small models)")
    device: str = Field(
        "auto",
        description="where models, data and VMask's ring arithmetic run: auto (cuda when "
        "available, or $VFLBENCH_DEVICE), cpu, cuda or cuda:N; not part of the config hash",
    )
    checkpoint: Literal["none", "final", "every_epoch"] = "final"
    save_embeddings: int = Field(
        0, ge=0, description="save the attacker's embeddings of this many test rows (embeddings.npz, for t-SNE plots)"
    )

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        return check_device(value)


class EvaluationConfig(_Strict):
    """How attacks are evaluated on each trained model."""

    repeats: int = Field(
        1,
        ge=1,
        le=100,
        description="independent repeats of every attack on each trained model "
        "(its own random stream and known labels each): the attack randomness, apart from the "
        "training randomness that seeds measure",
    )
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="level of every confidence interval reported")
    attacker_search: bool = Field(
        False,
        description="also run every attack with a search grid (its search_space) "
        "at the setting its own validation rows select, and report that attacker's leakage "
        "(leakage_worst, attacker_setting) beside the default attacker's",
    )
    search_budget: int = Field(
        8,
        ge=1,
        le=1000,
        description="settings the attacker search tries per attack (the "
        "default setting and a seeded random subset of the grid when it holds more)",
    )


class ComponentSpec(BaseModel):
    """A defense or attack by registry name, with its keyword parameters beside the name."""

    model_config = ConfigDict(extra="allow")
    name: str

    def params(self) -> dict[str, Any]:
        """The parameters other than ``name``."""
        return dict(self.model_extra or {})


class ExperimentConfig(_Strict):
    """A whole experiment: one scenario, its defenses and attacks, and the seed."""

    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    defenses: list[ComponentSpec] = Field(default_factory=list)
    attacks: list[ComponentSpec] = Field(default_factory=list)
    baselines: list[Literal["vanilla", "alone"]] = Field(default_factory=list)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    seed: int = Field(0, ge=0, le=MAX_SEED, description=f"the experiment seed, 0..{MAX_SEED}")
    sweep: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_algorithm(self) -> ExperimentConfig:
        algo = self.train.algorithm
        allowed = AGGREGATIONS[algo]
        if self.train.aggregation is not None and self.train.aggregation not in allowed:
            raise ValueError(
                f"aggregation {self.train.aggregation!r} is not allowed with {algo}; "
                f"{algo} allows: {', '.join(allowed)}"
            )
        if algo == "vlr":
            if self.model.bottom not in (None, "logreg"):
                raise ValueError(
                    f"VLR uses logreg bottom models, got {self.model.bottom!r}; use vhnn for neural bottoms"
                )
            if self.model.top not in (None, "identity"):
                raise ValueError(f"VLR has no top model (top: identity), got {self.model.top!r}")
        return self

    def resolved(self) -> ExperimentConfig:
        """A copy with every algorithm-dependent default made explicit."""
        algo = self.train.algorithm
        bottom, top = DEFAULT_MODELS[algo]
        out = self.model_copy(deep=True)
        out.model.bottom = self.model.bottom or bottom
        out.model.top = self.model.top or top
        out.train.aggregation = self.train.aggregation or AGGREGATIONS[algo][0]
        return out

    def hash(self) -> str:
        """A short stable hash of the resolved config and :data:`RESULTS_VERSION` (the run directory's name).
        ``train.device`` is left out: it says where a run computes, not what it computes (docs/decisions/devices.md,
        "Devices"); so are ``evaluation.attacker_search`` and ``search_budget`` while the search is off (a config
        without it keeps the hash it had before the search existed)."""
        payload = self.resolved().model_dump(mode="json", exclude={"sweep": True, "train": {"device"}})
        payload["results_version"] = RESULTS_VERSION
        if not self.evaluation.attacker_search:  # without a search its budget means nothing: hashes stay as they were
            for key in ("attacker_search", "search_budget"):
                payload["evaluation"].pop(key)
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def to_yaml(self) -> str:
        """The config as YAML."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """Valid keys of the config section at ``loc`` (for 'unknown key' messages)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return None
        annotation = current.model_fields[part].annotation
        candidates = [annotation, *typing.get_args(annotation)]
        nested = [
            a for a in candidates for a in (a, *typing.get_args(a)) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        current = nested[0] if nested else None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return None


def _bounds_at(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[Any, Any]:
    """The inclusive ``(lower, upper)`` bounds (``ge``/``le``) of the config field at ``loc``, ``None`` where
    it has none."""
    fields = _fields_at(model, loc[:-1])
    if not fields or loc[-1] not in fields:
        return None, None
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        annotation = current.model_fields[part].annotation
        current = next(
            a
            for a in (annotation, *typing.get_args(annotation))
            for a in (a, *typing.get_args(a))
            if isinstance(a, type) and issubclass(a, BaseModel)
        )
    lower = upper = None
    for meta in current.model_fields[loc[-1]].metadata:
        lower = getattr(meta, "ge", lower)
        upper = getattr(meta, "le", upper)
    return lower, upper


def _explain(exc: ValidationError) -> ConfigError:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "config"
        if err["type"] == "extra_forbidden":
            valid = _fields_at(ExperimentConfig, loc[:-1]) or []
            near = closest_name(str(loc[-1]), valid)
            hint = f" (did you mean {near!r}?)" if near else ""
            lines.append(f"unknown key {where!r}; valid keys here are: {', '.join(valid)}{hint}")
        elif err["type"] == "missing":
            lines.append(f"missing required key {where!r}")
        elif err["type"] in ("greater_than_equal", "less_than_equal") and None not in _bounds_at(ExperimentConfig, loc):
            lower, upper = _bounds_at(ExperimentConfig, loc)
            lines.append(f"{where} = {err['input']!r} is out of range; valid values are {lower} to {upper}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{where}: {msg}" if loc else msg)
    return ConfigError("invalid config: " + "; ".join(lines) + ".")


class _DuplicateKey(yaml.YAMLError):
    """A mapping key given twice (PyYAML would silently keep the last value)."""

    def __init__(self, key: Any, first: int, second: int) -> None:
        super().__init__(f"key {key!r} given twice")
        self.key, self.first, self.second = key, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""


def _unique_map(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: keys given here override the merged ones
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:  # PyYAML refuses an unhashable key itself
            continue
        line = key_node.start_mark.line + 1
        if key in seen:
            raise _DuplicateKey(key, seen[key], line)
        seen[key] = line
    yield from yaml.SafeLoader.construct_yaml_map(loader, node)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:map", _unique_map)


def _first_indent_tab(text: str, last_line: int) -> tuple[int, int] | None:
    """(line, column), 1-based, of the first tab in the indentation of lines 1..``last_line``."""
    for number, line in enumerate(text.splitlines()[:last_line], start=1):
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        if "\t" in indent:
            return number, indent.index("\t") + 1
    return None


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML ``text`` (from ``source``, named in errors) as ``yaml.safe_load`` does, but refuse a key
    given twice in one mapping, and turn every parse error into a one-line :class:`ConfigError` that says
    where it is (a tab in the indentation is named as such)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except _DuplicateKey as exc:
        raise ConfigError(
            f"{source}: the key {exc.key!r} is given twice in one section (lines {exc.first} and "
            f"{exc.second}); YAML would silently keep the last, so keep only one"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else len(text.splitlines())
        column = mark.column + 1 if mark is not None else 1
        tab = _first_indent_tab(text, line)
        lines = text.splitlines()
        if (
            mark is not None
            and line <= len(lines)
            and column <= len(lines[line - 1])
            and lines[line - 1][column - 1] == "\t"
        ):
            tab = (line, column)
        if tab is not None:
            raise ConfigError(
                f"{source}: a tab character at line {tab[0]} col {tab[1]}; YAML indents with spaces"
            ) from None
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        context = " ".join(str(getattr(exc, "context", None) or "").split())
        where = f" at line {line} col {column}" if mark is not None else ""
        raise ConfigError(
            f"{source} is not valid YAML: {problem}{where}" + (f" ({context})" if context else "")
        ) from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b.0.c=value`` into a key path and a YAML-parsed value."""
    if "=" not in item:
        raise ConfigError(f"--set expects key=value (e.g. train.epochs=5), got {item!r}")
    key, _, raw = item.partition("=")
    if not key.strip():
        raise ConfigError(f"--set {item!r} has an empty key")
    try:
        value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw.strip() else None  # a SafeLoader
    except _DuplicateKey as exc:
        raise ConfigError(f"--set {item!r}: the key {exc.key!r} is given twice; keep only one") from None
    except yaml.YAMLError as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(
            f"--set {item!r}: the value {raw!r} is not valid YAML ({problem}); quote a string "
            f"that holds YAML syntax, e.g. {key.strip()}='\"{raw}\"'"
        ) from None
    return key.strip().split("."), value


def apply_override(raw: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``value`` at ``path`` in a nested dict/list, creating dict levels as needed."""
    node: Any = raw
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            try:
                idx = int(part)
                if last:
                    node[idx] = value
                else:
                    node = node[idx]
                continue
            except (ValueError, IndexError):
                raise ConfigError(
                    f"--set {'.'.join(path)}: {part!r} is not a valid index of a list of {len(node)} items"
                ) from None
        if not isinstance(node, dict):
            raise ConfigError(f"--set {'.'.join(path)}: {'.'.join(path[:i])} is not a section")
        if last:
            node[part] = value
        else:
            node = node.setdefault(part, {})


def build_config(raw: dict[str, Any], overrides: list[str] = ()) -> ExperimentConfig:  # type: ignore[assignment]
    """Validate a raw mapping (with ``--set`` overrides applied) into a config."""
    data = copy.deepcopy(raw)
    for item in overrides:
        apply_override(data, *parse_override(item))
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc) from None


def load_config(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:  # type: ignore[assignment]
    """Read a YAML config file and validate it, its components included (:func:`check_components`)."""
    cfg = read_config(path, overrides)
    check_components(cfg)
    return cfg


def read_config(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:  # type: ignore[assignment]
    """Read a YAML config file and validate its structure, without importing the components to check them (a
    sweep starts its workers before :func:`check_components` imports torch)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p} is a directory; give the path of an experiment YAML file (e.g. configs/demo.yaml)")
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        raw = load_yaml(p.read_text(), str(p)) or {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p} must hold a mapping with sections data, model, train, defenses, attacks, seed")
    return build_config(raw, list(overrides))


def check_components(cfg: ExperimentConfig) -> None:
    """Check every named component of ``cfg`` and its parameters against the registries before any
    data is loaded: the dataset and its options, the bottom and top models and their options, each
    defense and attack (their parameters' names, types, choices and ranges, then their own checks).
    What needs the data's shape (classes, slice shapes) is checked by the run before training. ``train.device``
    must name a device this machine has."""
    from vflbench.attacks.registry import create_attack
    from vflbench.data import DATASETS
    from vflbench.defenses import create_defense
    from vflbench.models import BOTTOM_RESERVED, MODELS, TOP_MODELS, TOP_RESERVED

    resolve_device(cfg.train.device)
    resolved = cfg.resolved()
    DATASETS.check(cfg.data.name, cfg.data.options, reserved=("root",), noun="option", error=DataError)
    if resolved.model.bottom is not None:
        MODELS.check(resolved.model.bottom, cfg.model.bottom_options, reserved=BOTTOM_RESERVED, noun="option")
    if resolved.model.top is not None:
        TOP_MODELS.check(resolved.model.top, cfg.model.top_options, reserved=TOP_RESERVED, noun="option")
    for spec in cfg.defenses:
        create_defense(spec.name, **spec.params())
    for spec in cfg.attacks:
        create_attack(spec.name, **spec.params())
