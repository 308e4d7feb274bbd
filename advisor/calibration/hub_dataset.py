"""The text of a named calibration set (``set:NAME`` / ``set:PATH.yaml``), read with ``datasets.load_dataset``.

Rows are streamed from the start of the split and only as many are read as the windows need, so a set the
size of c4 costs a few rows, not a download of the whole split. The texts are joined as a .jsonl file's are
(:func:`advisor.calibration.tokens.from_text` cuts both into windows), so a set and the same rows saved as a
.jsonl give the same tokens.
"""

from __future__ import annotations

import os
from typing import Any

from advisor.errors import InputError, SetupError
from advisor.models.hub_access import with_hub_note
from advisor.recipe.calibration_sets import CalibrationSet, read_set

JOIN = "\n\n"  # what a .jsonl file's rows are joined with
#: tokens read past the windows' need, so the last window's tokens do not change with the next row's text
MARGIN_TOKENS = 16


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _rows(spec: CalibrationSet, source: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise SetupError(f"calibration.source: {source} needs the `datasets` package; pip install datasets, "
                         "or give a local .txt/.jsonl file") from None
    kwargs: dict[str, Any] = {"split": spec.split, "streaming": True}
    if spec.config:
        kwargs["name"] = spec.config
    if spec.data_files:
        missing = [f for f in spec.data_files if "*" not in f and "://" not in f and not os.path.exists(f)]
        if missing:
            raise InputError(f"calibration.source: {source}: data_files: {missing[0]} does not exist; "
                             "give paths relative to the spec's folder")
        kwargs["data_files"] = spec.data_files
    try:
        return datasets.load_dataset(spec.dataset, **kwargs)
    except ValueError as exc:  # an unknown split or config of a dataset that was found
        raise InputError(f"calibration.source: {source}: dataset {spec.dataset!r} "
                         f"(config {spec.config}, split {spec.split}): {_first_line(exc)}; fix config/split "
                         "in the spec") from None
    except (OSError, ImportError) as exc:  # offline, not in the cache, no such dataset, a builder's missing package
        reason = with_hub_note(_first_line(exc), spec.dataset)
        raise SetupError(f"calibration.source: cannot read dataset {spec.dataset!r} for {source} ({reason}); "
                         "download it where the hub is reachable (it is cached then), or give a local "
                         ".txt/.jsonl file") from None


def set_text(source: str, tokenizer: Any, need_tokens: int) -> tuple[str, str]:
    """The joined text of ``source``'s first rows, enough for ``need_tokens`` (all rows if fewer), and a label."""
    spec = read_set(source)
    texts: list[str] = []
    counted = 0
    try:
        for row in _rows(spec, source):
            if spec.text_field not in row:
                raise InputError(f"calibration.source: {source}: text_field: {spec.text_field!r} is not a field "
                                 f"of {spec.dataset} (its fields: {', '.join(row)}); name one of them")
            text = row[spec.text_field]
            if text is not None and not isinstance(text, str):  # else a whole split would stream by unread
                raise InputError(f"calibration.source: {source}: text_field: {spec.text_field!r} of "
                                 f"{spec.dataset} holds a {type(text).__name__}, not text; name a text field")
            if not text or not text.strip():
                continue
            texts.append(text)
            counted += len(tokenizer(text).input_ids)
            if counted >= need_tokens + MARGIN_TOKENS and len(tokenizer(JOIN.join(texts)).input_ids) >= (
                    need_tokens + MARGIN_TOKENS):
                break
    except OSError as exc:  # the stream broke off (network) after it opened
        raise SetupError(f"calibration.source: reading dataset {spec.dataset!r} for {source} failed "
                         f"({_first_line(exc)}); retry, or give a local .txt/.jsonl file") from None
    where = spec.dataset + (f"/{spec.config}" if spec.config else "")
    return JOIN.join(texts), f"{source} ({where}, {spec.split}, field {spec.text_field}, first {len(texts)} rows)"
