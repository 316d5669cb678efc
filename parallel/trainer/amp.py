"""Mixed precision and loss scaling for the trainer: one code path for CPU and Ascend.

``Model``'s loss-scale managers and ``TrainOneStepWithLossScaleCell`` do not run on CPU (they
need ``NPUGetFloatStatusV2``). The trainer scales with ``parallel.trainer.cells.LossScaler`` (``make_scaler``), the
rule of MindSpore's functional ``DynamicLossScaler``/``StaticLossScaler`` as plain graph ops.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Optional, TypeVar, Union

_E = TypeVar("_E", bound=enum.Enum)


class AmpError(ValueError):
    """A mixed-precision setting that is invalid or cannot run on this device."""


class AmpLevel(str, enum.Enum):
    """MindSpore's AMP levels.

    O0 keeps everything in float32; O1 casts the white-listed operators (Conv, MatMul, ...) to the
    low-precision type; O2 casts everything except the black-listed ones (BatchNorm, softmax, ...);
    O3 casts everything.
    """

    O0 = "O0"
    O1 = "O1"
    O2 = "O2"
    O3 = "O3"


class AmpDtype(str, enum.Enum):
    """The low-precision type the O1-O3 levels cast to."""

    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"


class LossScaleMode(str, enum.Enum):
    """How the loss is scaled before the backward pass.

    ``dynamic`` halves the scale on an overflow (and skips that update) and doubles it after
    ``window`` clean steps; ``fixed`` keeps one scale (an overflowing update is still skipped);
    ``none`` does not scale.
    """

    DYNAMIC = "dynamic"
    FIXED = "fixed"
    NONE = "none"


@dataclasses.dataclass(frozen=True)
class LossScaleConfig:
    """Loss scaling: the mode, the starting scale, and the dynamic growth rule."""

    mode: LossScaleMode = LossScaleMode.DYNAMIC
    init_scale: float = 2.0 ** 16
    factor: int = 2
    window: int = 1000

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", _enum(LossScaleMode, self.mode, "loss_scale"))
        if self.init_scale < 1.0:
            raise AmpError(f"loss scale init_scale must be >= 1, got {self.init_scale}")
        if self.factor < 2 or self.window < 1:
            raise AmpError(f"loss scale needs factor >= 2 and window >= 1, "
                           f"got factor={self.factor}, window={self.window}")

    @classmethod
    def of(cls, value: Union["LossScaleConfig", LossScaleMode, str, None],
           level: AmpLevel) -> "LossScaleConfig":
        """Accept a config, a mode name, or ``None`` (dynamic for O1-O3, none for O0)."""
        if isinstance(value, LossScaleConfig):
            return value
        if value is None:
            value = LossScaleMode.NONE if level is AmpLevel.O0 else LossScaleMode.DYNAMIC
        return cls(mode=_enum(LossScaleMode, value, "loss_scale"))


def parse_level(value: Union[AmpLevel, str]) -> AmpLevel:
    """``"O1"`` (or ``"o1"``) -> ``AmpLevel.O1``; anything else raises :class:`AmpError`."""
    return _enum(AmpLevel, value.upper() if isinstance(value, str) else value, "amp_level")


def parse_dtype(value: Union[AmpDtype, str]) -> AmpDtype:
    """``"float16"``/``"fp16"`` or ``"bfloat16"``/``"bf16"`` -> :class:`AmpDtype`."""
    aliases = {"fp16": "float16", "bf16": "bfloat16"}
    if isinstance(value, str):
        value = aliases.get(value.lower(), value.lower())
    return _enum(AmpDtype, value, "amp_dtype")


def device_note(level: AmpLevel, dtype: AmpDtype, device_target: str) -> Optional[str]:
    """One line saying why ``level`` cannot help on ``device_target``, or ``None`` when it can.

    Raises :class:`AmpError` when it cannot run at all (bfloat16 on CPU).
    """
    if level is AmpLevel.O0 or device_target != "CPU":
        return None
    if dtype is AmpDtype.BFLOAT16:
        raise AmpError(f"AMP {level.value} with bfloat16 cannot run on CPU: Conv2D, MatMul and "
                       "BatchNorm have no BFloat16 CPU kernels (use float16, or O0)")
    return (f"AMP {level.value} on CPU: float16 kernels are slower than float32 here, so it runs "
            "but saves no time (it pays off on Ascend)")


def apply_amp(network: Any, level: AmpLevel, dtype: AmpDtype) -> Any:
    """Return ``network`` with ``level`` mixed precision applied (the same object for O0 and O1).

    O1 is done here, by cells, in place: MindSpore 2.10's own O1 rewrites the network's source
    into ``./rewritten_network/`` under the current directory and fails (``NameError``) on network
    classes that are not defined at module level. Functional calls in ``construct``
    (``ops.matmul``) therefore stay in float32 under O1; O2 and O3 cast them too.
    """
    if level is AmpLevel.O0:
        return network
    import mindspore as ms
    from mindspore import amp

    ms_dtype = getattr(ms, dtype.value)
    if level is AmpLevel.O1:
        _cast_cells(network, _o1_cells(), ms_dtype)
        return network
    return amp.auto_mixed_precision(network, level.value, ms_dtype)


_O1_CELLS = ("Conv1d", "Conv2d", "Conv3d", "Conv1dTranspose", "Conv2dTranspose", "Conv3dTranspose",
             "Dense", "LSTMCell", "RNNCell", "GRUCell")
"""The cell classes in MindSpore's O1 white list (``mindspore.train.amp.AMP_WHITE_LIST``)."""


def _o1_cells() -> tuple[type[Any], ...]:
    from mindspore import nn

    return tuple(getattr(nn, name) for name in _O1_CELLS)


def _cast_cells(network: Any, kinds: tuple[type[Any], ...], dtype: Any) -> None:
    """Run every sub-cell of ``kinds`` in ``dtype`` with its output cast back to float32."""
    from mindspore import nn
    from mindspore.train.amp import _OutputTo32

    changed = False
    for name, cell in network.name_cells().items():
        if isinstance(cell, kinds):
            # Through _cells, as MindSpore's own O2 does: setattr would re-prefix parameter names.
            network._cells[name] = _OutputTo32(cell.to_float(dtype))
            changed = True
        else:
            _cast_cells(cell, kinds, dtype)
    if changed and isinstance(network, nn.SequentialCell):
        network.cell_list = list(network.cells())


def scaler_state(scaler: Optional[Any]) -> tuple[float, int]:
    """``(scale, clean steps counted towards the next growth)``; ``(1.0, 0)`` without a scaler."""
    if scaler is None:
        return 1.0, 0
    counter = getattr(scaler, "counter", None)
    return float(scaler.scale_value.asnumpy()), int(counter.asnumpy()) if counter is not None else 0


def restore_scaler(scaler: Optional[Any], scale: float, counter: int) -> None:
    """Put a saved ``(scale, counter)`` back into ``scaler`` (a no-op without one)."""
    if scaler is None:
        return
    import mindspore as ms

    scaler.scale_value.set_data(ms.Tensor(scale, ms.float32))
    if getattr(scaler, "counter", None) is not None:
        scaler.counter.set_data(ms.Tensor(counter, ms.int32))


def _enum(kind: type[_E], value: Any, what: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        choices = "|".join(member.value for member in kind)
        raise AmpError(f"{what} must be one of {choices}, got {value!r}") from None
