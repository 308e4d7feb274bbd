"""A plan: which format each layer group runs in."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from advisor.errors import InputError
from advisor.formats import FORMAT_SPECS, Format

# The fused GEMMs of a dense decoder layer, in execution order (engines fuse q/k/v and gate/up).
DENSE_GROUP_KINDS = ("qkv", "o", "gate_up", "down")


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
    """Map of group name -> format. Immutable; the id is a hash of the content."""

    formats: Mapping[str, Format] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "formats", {k: Format(v) for k, v in sorted(self.formats.items())}
        )

    @classmethod
    def uniform(cls, groups: Iterable[LayerGroup | str], fmt: Format) -> Plan:
        return cls({g if isinstance(g, str) else g.name: fmt for g in groups})

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def id(self) -> str:
        canonical = json.dumps({k: v.value for k, v in self.formats.items()}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    def format_of(self, group: str) -> Format:
        return self.formats[group]

    def counts(self) -> dict[Format, int]:
        out = {f: 0 for f in Format}
        for fmt in self.formats.values():
            out[fmt] += 1
        return out

    def uniform_format(self) -> Format | None:
        used = set(self.formats.values())
        return used.pop() if len(used) == 1 else None

    def label(self) -> str:
        """Short human name: 'all-fp8' for uniform plans, else counts per format."""
        uniform = self.uniform_format()
        if uniform is not None:
            return f"all-{uniform.value}"
        parts = [f"{n} {f.value}" for f, n in self.counts().items() if n]
        return "mixed (" + ", ".join(parts) + ")"

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
        return json.dumps(
            {"id": self.id, "formats": {k: v.value for k, v in self.formats.items()}},
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
            formats = data.get("formats", data)
            plan = cls({str(k): Format(v) for k, v in formats.items()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            allowed = ", ".join(f.value for f in Format)
            raise InputError(
                f"not a plan: expected {{'formats': {{group: format}}}} with formats "
                f"in {allowed} ({exc}); `advisor show RUN_DIR --plan ID > plan.json` writes one"
            ) from None
        if "id" in data and data["id"] != plan.id:
            raise InputError(f"plan id {data['id']} does not match its content ({plan.id})")
        return plan

    @classmethod
    def load(cls, path: Path) -> Plan:
        try:
            return cls.from_json(Path(path).read_text())
        except OSError as exc:
            raise InputError(f"cannot read plan file {path}: {exc.strerror}; "
                             "`advisor show RUN_DIR --plan ID > plan.json` writes one") from None
