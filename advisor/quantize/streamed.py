"""Bank entries of layers that stream from CPU memory (accelerate's offload hooks).

A layer the GPUs cannot hold is loaded with accelerate's dispatch (transformers' ``device_map`` with the layer
on ``"cpu"``): each of its modules keeps its weights in CPU memory, on the meta device between forwards, and an
``AlignDevicesHook`` copies them to the execution device as the module runs. ModelOpt calibrates such a model as
it is (its accelerate plugin opens the weights where it needs them). The format copies share the CPU weights
(:func:`shared_offload_maps`), and a streamed module's own bank entry (folded weights as codes, quantizer
state) goes to CPU memory under an offload hook of its own, so it streams to the GPU with the module; the codes
are decoded there, after the hook has put them in place (:class:`DecodePacked`, chained to it).
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.hooks import AlignDevicesHook, ModelHook, SequentialHook, add_hook_to_module, remove_hook_from_module
from accelerate.utils import OffloadedWeightsLoader, PrefixedDataset

from advisor.formats import Format
from advisor.quantize.packed import PackStats, _materialize, _release, fold_and_pack


def offload_hook(module: torch.nn.Module) -> AlignDevicesHook | None:
    """The accelerate hook that streams ``module``'s own weights from CPU memory, if it has one."""
    hook = getattr(module, "_hf_hook", None)
    hooks = hook.hooks if isinstance(hook, SequentialHook) else [hook]
    return next((h for h in hooks if isinstance(h, AlignDevicesHook) and h.offload), None)


def is_streamed(model: torch.nn.Module) -> bool:
    return any(offload_hook(m) is not None for m in model.modules())


def shared_offload_maps(model: torch.nn.Module) -> dict[int, Any]:
    """``copy.deepcopy`` memo entries that make a copy of ``model`` share its streamed layers' CPU weights."""
    memo: dict[int, Any] = {}
    for m in model.modules():
        hook = offload_hook(m)
        if hook is not None and hook.weights_map is not None:
            data = getattr(hook.weights_map, "dataset", hook.weights_map)
            memo[id(data)] = data
    return memo


class DecodePacked(ModelHook):
    """Decode a streamed module's packed weights once its offload hook has brought the codes; drop them after."""

    def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        _materialize(module, args)
        return args, kwargs

    def post_forward(self, module: torch.nn.Module, output: Any) -> Any:
        _release(module, None, output)
        return output


@torch.no_grad()
def fold_and_pack_streamed(module: torch.nn.Module, fmt: Format, name: str, stats: PackStats,
                           root: torch.nn.Module) -> None:
    """:func:`advisor.quantize.packed.fold_and_pack` for a module whose weights stream from CPU memory: folded
    and packed on its execution device, then its own tensors (codes, kept BF16 weights, bias, quantizer state)
    held in CPU memory and streamed by an offload hook of its own."""
    from modelopt.torch.quantization.utils import enable_weight_access_and_writeback

    device = offload_hook(module).execution_device
    with enable_weight_access_and_writeback(module, root, writeback=False):  # the shared BF16 weights stay as they are
        fold_and_pack(module, fmt, name, stats, decode_hooks=False)
        packed = list(getattr(module, "packed_weights", {}))
        placeholders = {w: module._parameters.pop(w).detach() for w in packed}
        for w, placeholder in placeholders.items():  # decoded by DecodePacked, never loaded by the offload hook
            module.register_buffer(w, placeholder, persistent=False)
        state = {k: t.detach().to("cpu") for k, t in module.state_dict().items()}
    remove_hook_from_module(module)  # puts the streamed BF16 weight back in place of each placeholder: undone below
    for w, placeholder in placeholders.items():
        module._buffers[w] = placeholder
    add_hook_to_module(module, AlignDevicesHook(
        execution_device=device, offload=True, offload_buffers=True, place_submodules=True,
        weights_map=PrefixedDataset(OffloadedWeightsLoader(state_dict=state), "")))
    if packed:
        add_hook_to_module(module, DecodePacked(), append=True)
