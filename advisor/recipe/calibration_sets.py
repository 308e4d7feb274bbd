"""Named calibration sets: ``calibration.source: set:NAME`` (a YAML spec under the top-level ``calibration/``
folder, shipped inside the package as ``advisor/recipe/shipped_sets``) or ``set:PATH.yaml`` (a user's
own spec). A spec names a dataset that ``datasets.load_dataset`` reads and the field that holds its text;
the data itself is fetched at run time, never kept in the repository.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from advisor.errors import InputError
from advisor.files import check_regular_file

SET_PREFIX = "set:"
#: the top-level calibration/ folder of a checkout; in a wheel, the copy setuptools made of it
SETS_DIR = Path(__file__).resolve().parent / "shipped_sets"


class CalibrationSet(BaseModel):
    """One calibration set: what ``datasets.load_dataset`` is given, and which field is the text."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    why: str = Field(description="one line: what text this is and when to calibrate on it")
    dataset: str = Field(description="hub dataset id, or a builder ('json', 'parquet', 'text') with data_files")
    config: str | None = Field(None, description="dataset configuration name (load_dataset's `name`)")
    split: str = Field("train", description="split to read from its start")
    text_field: str = Field(description="the field of a row that holds the text")
    data_files: list[str] | None = Field(None, description="local files for a builder, relative to the spec")


def shipped_sets() -> dict[str, Path]:
    """Name -> spec file of every set under calibration/."""
    return {p.stem: p for p in sorted(SETS_DIR.glob("*.yaml"))}


def is_set_source(source: str) -> bool:
    return source.startswith(SET_PREFIX)


def set_spec_path(source: str) -> Path:
    """The spec file ``set:NAME`` or ``set:PATH.yaml`` stands for; InputError for an unknown name."""
    ref = source.removeprefix(SET_PREFIX)
    if ref.endswith((".yaml", ".yml")):
        return Path(ref).expanduser()
    known = shipped_sets()
    if ref not in known:
        raise InputError(f"calibration.source: unknown calibration set {ref!r}; name one of "
                         f"{', '.join(known) or '(none shipped)'} or give set:PATH.yaml (calibration/README.md)")
    return known[ref]


def read_set(source: str) -> CalibrationSet:
    """The validated spec of ``source`` (``set:...``); ``data_files`` made relative to the spec's folder."""
    path = set_spec_path(source)
    fix = "give a YAML spec like calibration/cnn_dailymail.yaml"
    check_regular_file(path, "calibration.source:", fix)
    if not path.is_file():
        raise InputError(f"calibration.source: set spec {path} does not exist; {fix}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"calibration.source: set spec {path} is not UTF-8 text (byte {exc.start}); {fix}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"calibration.source: set spec {path} is not valid YAML "
                         f"({getattr(exc, 'problem', None) or type(exc).__name__}{where}); {fix}") from None
    if not isinstance(data, dict):
        raise InputError(f"calibration.source: set spec {path} must be a mapping of fields; {fix}")
    try:
        spec = CalibrationSet.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg'].lower()}" for e in exc.errors())
        raise InputError(f"calibration.source: set spec {path}: {problems}; {fix}") from None
    if spec.data_files:
        files = [str(path.parent / Path(f).expanduser()) for f in spec.data_files]
        spec = spec.model_copy(update={"data_files": files})
    return spec
