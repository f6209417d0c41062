"""Reading `ext.bmx`: the client's (or a policy's) rerank parameters, validated into a `RerankSpec`.

Every invalid value is a 400 in Elasticsearch's own error shape, so a client learns what to fix the
same way it learns it from the cluster: wrong JSON types are `x_content_parse_exception`, values out of
range `illegal_argument_exception`, unknown keys `x_content_parse_exception` ("unknown field")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bmx_rerank.errors import SearchError, bad_request
from bmx_rerank.rerank.augment import WEIGHT_RANGE, Augment, parse_augment
from bmx_rerank.rerank.query import parse_field
from bmx_rerank.scoring import MODES, NORMALIZATIONS, WQA_MODES, Request

DEFAULT_WINDOW = 100
MAX_WINDOW = 10_000  # Elasticsearch's index.max_result_window default: a bigger window fails upstream anyway
# Finite ranges of the numeric parameters (docs/proxy.md): wide enough for any tuning, narrow enough
# that no score can overflow a float64 (alpha = beta = 1e308 would give inf and NaN scores).
RANGES: dict[str, tuple[float, float]] = {
    "alpha": (0.0, 100.0),
    "beta": (0.0, 100.0),
    "k1": (0.0, 100.0),
    "b": (0.0, 1.0),
    "min_score": (-1e9, 1e9),
    "weights": WEIGHT_RANGE,  # augment.weights and augment.weight (checked in `augment`)
    "weight": (0.0, 1.0),
    "boost": (0.0, 100.0),  # of a field in [fields]: title^2
}

COMBINE = ("replace", "linear", "rrf")
MAX_FIELDS = 32

KEYS = (
    "field",
    "fields",
    "combine",
    "weight",
    "rank_constant",
    "query",
    "window_size",
    "alpha",
    "beta",
    "k1",
    "b",
    "normalize",
    "min_score",
    "mode",
    "augment",
    "wqa_mode",
    "widen",
    "explain",
    "deadline",
)
MAX_DEADLINE = 3600.0  # seconds: ext.bmx.deadline's upper bound (the server's --deadline caps it too)


@dataclass(frozen=True)
class RerankSpec:
    """What one reranked search asks for; `query` None means "take it from the request's match query"."""

    field: str
    query: str | None = None
    window_size: int = DEFAULT_WINDOW
    scoring: Request = field(default_factory=Request)  # the scoring core's parameters, as it takes them
    min_score: float | None = None
    augment: Augment = field(default_factory=Augment)
    widen: bool = True
    explain: bool = False
    # Several fields: (name, weight) pairs; empty means `field` alone. A weight multiplies every leaf
    # on that field in the scoring tree (see `query.weigh`).
    fields: tuple[tuple[str, float], ...] = ()
    # Hybrid: how BMX meets the first stage's own score (None: only plain text scoring is reranked).
    combine: str | None = None
    weight: float = 0.5  # `linear`: the weight of the normalized first-stage score
    rank_constant: int = 60  # `rrf`: as Elasticsearch's RRF
    deadline: float | None = None  # seconds for the whole search (the server's --deadline caps it)

    def __post_init__(self) -> None:
        if not self.fields:
            object.__setattr__(self, "fields", ((self.field, 1.0),))

    @property
    def field_names(self) -> tuple[str, ...]:
        """The fields this rerank may score, in the order given."""
        return tuple(name for name, _ in self.fields)

    @property
    def mode(self) -> str:
        return self.scoring.mode

    @property
    def normalize(self) -> str:
        return self.scoring.normalize

    @property
    def wqa_mode(self) -> str:
        return self.scoring.wqa_mode

    @property
    def alpha(self) -> float | None:
        return self.scoring.alpha

    @property
    def beta(self) -> float | None:
        return self.scoring.beta

    @property
    def k1(self) -> float:
        return self.scoring.k1

    @property
    def b(self) -> float:
        return self.scoring.b

    def scoring_request(self) -> Request:
        """The scoring core's view of these parameters."""
        return self.scoring

    def marker(self) -> dict[str, Any]:
        """The parameters echoed in the `_bmx` marker of a reranked answer."""
        return {
            "mode": self.mode,
            "field": self.field,
            "window_size": self.window_size,
            "normalize": self.normalize,
            "wqa_mode": self.wqa_mode if self.augment.queries or self.augment.provider != "given" else None,
            **({"augment": self.augment.marker()} if self.augment.marker() else {}),
            **({"fields": list(self.field_names)} if len(self.fields) > 1 else {}),
            **({"combine": self.combine} if self.combine else {}),
        }


def parse_spec(raw: Any, *, widen_default: bool = True, where: str = "bmx") -> RerankSpec:
    """Validate `ext.bmx` (a JSON object) into a spec, or raise a 400 `SearchError`."""
    if not isinstance(raw, Mapping):
        raise _parse_error(f"[{where}] expected an object, got {_kind(raw)}")
    unknown = [k for k in raw if k not in KEYS]
    if unknown:
        raise _parse_error(f"[{where}] unknown field [{unknown[0]}]")
    fields = _fields(raw, where) if raw.get("fields") is not None else ()
    if "field" not in raw and not fields:
        raise bad_request(f"[{where}] requires [field]: the text field to rerank on")
    first = _string(raw, "field", where) if "field" in raw else fields[0][0]
    if fields and first not in (name for name, _ in fields):
        raise bad_request(f"[{where}] [field] [{first}] must be one of [fields]")
    values: dict[str, Any] = {"widen": widen_default}
    if raw.get("combine") is not None:
        values["combine"] = _choice(raw, "combine", where, COMBINE)
    if raw.get("weight") is not None:
        values["weight"] = _number(raw, "weight", where)
    if raw.get("rank_constant") is not None:
        values["rank_constant"] = _integer(raw, "rank_constant", where, 1, 1_000_000)
    if raw.get("query") is not None:
        values["query"] = _string(raw, "query", where, allow_empty=True)
    if "window_size" in raw:
        values["window_size"] = _integer(raw, "window_size", where, 1, MAX_WINDOW)
    core: dict[str, Any] = {}  # the scoring core's parameters (`Request`)
    for name in ("alpha", "beta", "k1", "b"):
        if raw.get(name) is not None:
            core[name] = _number(raw, name, where)
    if raw.get("min_score") is not None:
        values["min_score"] = _number(raw, "min_score", where)
    if "normalize" in raw:
        core["normalize"] = (
            "none" if raw["normalize"] is None else _choice(raw, "normalize", where, NORMALIZATIONS)
        )
    if "mode" in raw:
        core["mode"] = _choice(raw, "mode", where, MODES)
    if "wqa_mode" in raw:
        core["wqa_mode"] = _choice(raw, "wqa_mode", where, WQA_MODES)
    for name in ("widen", "explain"):
        if name in raw:
            values[name] = _boolean(raw, name, where)
    if raw.get("augment") is not None:
        values["augment"] = parse_augment(raw["augment"], where)
    if raw.get("deadline") is not None:
        deadline = raw["deadline"]
        if not _is_number(deadline) or not 0 < deadline <= MAX_DEADLINE:
            raise _parse_error(f"[{where}] [deadline] must be a number of seconds in (0, {MAX_DEADLINE:g}]")
        values["deadline"] = float(deadline)
    try:
        values["scoring"] = Request(**core)
    except ValueError as exc:  # the core's own checks, should a combination slip through
        raise bad_request(f"[{where}] {exc}") from exc
    return RerankSpec(field=first, fields=fields, **values)


def _fields(raw: Mapping[str, Any], where: str) -> tuple[tuple[str, float], ...]:
    """`["title^2", "text"]`: names with optional weights, no patterns, no repeats."""
    value = raw["fields"]
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
        raise _parse_error(f"[{where}] [fields] expected an array of strings")
    if not 1 <= len(value) <= MAX_FIELDS:
        raise bad_request(f"[{where}] [fields] must name 1 to {MAX_FIELDS} fields, got {len(value)}")
    try:
        fields = tuple(parse_field(f) for f in value)
    except ValueError as exc:
        raise bad_request(f"[{where}] [fields] {exc}") from None
    low, high = RANGES["boost"]
    for name, boost in fields:
        if not low <= boost <= high:
            raise bad_request(
                f"[{where}] [fields] the boost of [{name}] must be a number in [{low:g}, {high:g}]"
            )
    names = [name for name, _ in fields]
    if any("*" in name for name in names):
        raise bad_request(f"[{where}] [fields] must name fields, not patterns: statistics are per field")
    if len(set(names)) != len(names):
        raise bad_request(f"[{where}] [fields] names a field twice")
    return fields


def _string(raw: Mapping[str, Any], name: str, where: str, allow_empty: bool = False) -> str:
    value = raw[name]
    if not isinstance(value, str):
        raise _parse_error(f"[{where}] [{name}] expected a string, got {_kind(value)}")
    if not value and not allow_empty:
        raise bad_request(f"[{where}] [{name}] must not be empty")
    return value


def _integer(raw: Mapping[str, Any], name: str, where: str, low: int, high: int) -> int:
    value = raw[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _parse_error(f"[{where}] [{name}] expected an integer, got {_kind(value)}")
    if not low <= value <= high:
        raise bad_request(f"[{where}] [{name}] must lie in [{low}, {high}], got {value}")
    return value


def _number(raw: Mapping[str, Any], name: str, where: str) -> float:
    value = raw[name]
    if not _is_number(value):
        raise _parse_error(f"[{where}] [{name}] expected a number, got {_kind(value)}")
    try:
        value = float(value)
    except OverflowError:  # an integer beyond float64
        value = math.inf
    low, high = RANGES[name]
    if not low <= value <= high:  # also rejects NaN
        raise bad_request(f"[{where}] [{name}] must be a number in [{low:g}, {high:g}], got {value}")
    return value


def _choice(raw: Mapping[str, Any], name: str, where: str, choices: tuple[str, ...]) -> str:
    value = raw[name]
    if not isinstance(value, str):
        raise _parse_error(f"[{where}] [{name}] expected a string, got {_kind(value)}")
    if value not in choices:
        raise bad_request(f"[{where}] [{name}] must be one of [{', '.join(choices)}], got [{value}]")
    return value


def _boolean(raw: Mapping[str, Any], name: str, where: str) -> bool:
    value = raw[name]
    if not isinstance(value, bool):
        raise _parse_error(f"[{where}] [{name}] expected a boolean, got {_kind(value)}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if _is_number(value) else type(value).__name__
    )


def _parse_error(reason: str) -> SearchError:
    return bad_request(reason, "x_content_parse_exception")
