"""A plan: which format each layer group runs in, and the format of the KV cache."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from advisor.errors import InputError
from advisor.files import check_regular_file
from advisor.formats import FORMAT_SPECS, KV_CACHE_FORMATS, Format

# The fused GEMMs of a dense decoder layer, in execution order (engines fuse q/k/v and gate/up).
DENSE_GROUP_KINDS = ("qkv", "o", "gate_up", "down")
# The KV-cache format's key in a plan's JSON and its Optuna parameter name (no group is called so).
KV_CACHE_KEY = "kv_cache"


@dataclass(frozen=True)
class LayerGroup:
    """Linear layers that a serving engine fuses and therefore share one format.

    ``shapes`` holds (in_features, out_features) of each member, in member order.
    """

    name: str
    members: tuple[str, ...]
    shapes: tuple[tuple[int, int], ...]

    @property
    def num_weights(self) -> int:
        return sum(i * o for i, o in self.shapes)

    @property
    def out_features(self) -> int:
        return sum(o for _, o in self.shapes)

    @property
    def in_features(self) -> int:
        return self.shapes[0][0]


@dataclass(frozen=True)
class Plan:
    """Map of group name -> format, plus the KV-cache format. Immutable; the id is a hash of the content.

    The KV cache is part of the id only when it is not BF16, so every plan made before the KV
    cache was searched keeps its id.
    """

    formats: Mapping[str, Format] = field(default_factory=dict)
    kv_cache: Format = Format.BF16

    def __post_init__(self) -> None:
        if KV_CACHE_KEY in self.formats:
            raise InputError(f"{KV_CACHE_KEY!r} is not a layer group; give the KV-cache format as kv_cache=")
        object.__setattr__(
            self, "formats", {k: Format(v) for k, v in sorted(self.formats.items())}
        )
        kv = Format(self.kv_cache)
        if kv not in KV_CACHE_FORMATS:
            raise InputError(f"kv_cache: got {kv.value!r}; allowed: {', '.join(f.value for f in KV_CACHE_FORMATS)}")
        object.__setattr__(self, "kv_cache", kv)

    @classmethod
    def uniform(cls, groups: Iterable[LayerGroup | str], fmt: Format, kv_cache: Format = Format.BF16) -> Plan:
        return cls({g if isinstance(g, str) else g.name: fmt for g in groups}, kv_cache)

    def with_kv_cache(self, kv_cache: Format) -> Plan:
        return Plan(self.formats, kv_cache)

    def __hash__(self) -> int:
        return hash(self.id)

    def _content(self) -> dict[str, object]:
        formats = {k: v.value for k, v in self.formats.items()}
        if self.kv_cache == Format.BF16:
            return formats
        return {"formats": formats, KV_CACHE_KEY: self.kv_cache.value}

    @property
    def id(self) -> str:
        canonical = json.dumps(self._content(), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    def format_of(self, group: str) -> Format:
        return self.formats[group]

    def counts(self) -> dict[Format, int]:
        out = {f: 0 for f in Format}
        for fmt in self.formats.values():
            out[fmt] += 1
        return out

    def uniform_weights(self) -> Format | None:
        """The one format of every group, whatever the KV cache (None for a mixed plan)."""
        used = set(self.formats.values())
        return used.pop() if len(used) == 1 else None

    def uniform_format(self) -> Format | None:
        """The plan's one format: every group's, and a BF16 KV cache (None otherwise).

        So the all-BF16 reference is ``uniform_format() == BF16``: BF16 weights with an FP8
        KV cache are not it.
        """
        return self.uniform_weights() if self.kv_cache == Format.BF16 else None

    def label(self) -> str:
        """Short human name: 'all-fp8' for uniform plans, else counts per format; '+ fp8 KV' when not BF16."""
        uniform = self.uniform_weights()
        if uniform is not None:
            base = f"all-{uniform.value}"
        else:
            parts = [f"{n} {f.value}" for f, n in self.counts().items() if n]
            base = "mixed (" + ", ".join(parts) + ")"
        return base if self.kv_cache == Format.BF16 else f"{base} + {self.kv_cache.value} KV"

    def params(self, kv_dimension: bool = False) -> dict[str, str]:
        """The plan as Optuna parameters: one per group, and ``kv_cache`` when the search has that
        dimension (or the plan's KV cache is not BF16)."""
        out = {k: v.value for k, v in self.formats.items()}
        if kv_dimension or self.kv_cache != Format.BF16:
            out[KV_CACHE_KEY] = self.kv_cache.value
        return out

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> Plan:
        """The plan of Optuna parameters (:meth:`params`); no ``kv_cache`` parameter means BF16."""
        formats = {k: Format(str(v)) for k, v in params.items() if k != KV_CACHE_KEY}
        return cls(formats, Format(str(params.get(KV_CACHE_KEY, Format.BF16.value))))

    def effective_bits(self, groups: Iterable[LayerGroup]) -> float:
        """Weight bits per element over the quantizable layers, scales included."""
        total = bits = 0.0
        for g in groups:
            total += g.num_weights
            bits += g.num_weights * FORMAT_SPECS[self.formats[g.name]].effective_bits
        return bits / total if total else 16.0

    def check_against(self, groups: Iterable[LayerGroup]) -> None:
        names = {g.name for g in groups}
        missing = sorted(names - set(self.formats))
        extra = sorted(set(self.formats) - names)
        if missing or extra:
            raise InputError(
                f"plan {self.id} does not match the model's layer groups: "
                f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"unknown {extra[:5]}{'...' if len(extra) > 5 else ''}; the plan was made for another model: "
                "give the model it was searched on"
            )

    def to_json(self) -> str:
        data: dict[str, object] = {"id": self.id, "formats": {k: v.value for k, v in self.formats.items()}}
        if self.kv_cache != Format.BF16:
            data[KV_CACHE_KEY] = self.kv_cache.value
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
            formats = data.get("formats", data)
            kv = Format(data.get(KV_CACHE_KEY, Format.BF16.value)) if "formats" in data else Format.BF16
            plan = cls({str(k): Format(v) for k, v in formats.items()}, kv)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            allowed = ", ".join(f.value for f in Format)
            raise InputError(
                f"not a plan: expected {{'formats': {{group: format}}, 'kv_cache': bf16|fp8}} with formats "
                f"in {allowed} ({exc}); `advisor show RUN_DIR --plan ID > plan.json` writes one"
            ) from None
        if "id" in data and data["id"] != plan.id:
            raise InputError(f"plan id {data['id']} does not match its content ({plan.id})")
        return plan

    @classmethod
    def load(cls, path: Path) -> Plan:
        check_regular_file(path, "plan file", "`advisor show RUN_DIR --plan ID > plan.json` writes one")
        try:
            return cls.from_json(Path(path).read_text())
        except OSError as exc:
            raise InputError(f"cannot read plan file {path}: {exc.strerror}; "
                             "`advisor show RUN_DIR --plan ID > plan.json` writes one") from None
        except UnicodeDecodeError:
            raise InputError(f"plan file {path} is not UTF-8 text (a binary file?); give a plan JSON file: "
                             "`advisor show RUN_DIR --plan ID > plan.json` writes one") from None
