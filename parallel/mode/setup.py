"""``parallel.init()``: make the current process a configured MindSpore rank.

It works under npu-launch, msrun, a rank table, OpenMPI or by hand: the identity comes from
``contract.RankIdentity`` (which reads all of them), and after MindSpore's communication init the
rank and world size MindSpore reports win.

The parallel mode is applied with ``mindspore.set_auto_parallel_context`` rather than the newer
``mindspore.parallel.auto_parallel.AutoParallel``: ``AutoParallel`` wraps a network Cell and
applies its settings when that Cell compiles, but ``init()`` runs before any network exists, and
a launcher-level setting must hold for every network the script builds.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple, Union

import mindspore as ms

from parallel import contract, events
from parallel.config import DeviceTarget, ExecMode, ParallelConfig, ParallelMode
from parallel.mode.topology import RankInfo, coordinates_of, groups_of

_DEVICE_KINDS = {"npu": DeviceTarget.ASCEND, "ascend": DeviceTarget.ASCEND, "cpu": DeviceTarget.CPU}


class NeedsAscendError(RuntimeError):
    """The parallel configuration cannot run on this rank's device (CPU)."""


def init(config: Optional[ParallelConfig] = None, *,
         exec_mode: Union[ExecMode, str, None] = None) -> RankInfo:
    """Select the device and execution mode, join the cluster, apply the parallel mode and seed.

    ``config`` defaults to the JSON in ``$NPU_LAUNCH_PARALLEL`` (else plain data parallelism).
    The rank runs in GRAPH_MODE (MindSpore's own default is PyNative) unless ``exec_mode`` says
    ``"pynative"``, or in debug mode (``$NPU_LAUNCH_DEBUG=1``, set by ``npu-launch --debug``), which
    runs PyNative so breakpoints stop inside ``construct``.
    In debug mode or for a lone process (world size 1, no ``MS_ROLE``) there is no communication
    init. Raises ``NeedsAscendError`` before touching the cluster when the layout needs Ascend and
    the device is CPU, ``ValueError`` for an unknown ``exec_mode``, and
    ``parallel.config.LayoutError`` when the layout does not fit the world.
    """
    environ = os.environ
    identity = contract.RankIdentity.from_environ(environ)
    mode, mode_source = choose_exec_mode(exec_mode, identity.debug)
    nnodes = _nnodes(environ)
    config = (config or config_from_environ(environ)).validate(identity.world_size, nnodes)
    device = select_device(identity.device_kind)
    check_supported(config, device)
    _set_device(device, identity.device_id, mode)
    rank, world = identity.rank, identity.world_size
    if _joins_cluster(identity, environ):
        rank, world = _init_communication()
        config = config.validate(world, nnodes)
        apply_parallel_context(config, world, rank)
    ms.set_seed(config.seed)
    info = RankInfo(rank=rank, world_size=world, local_rank=identity.local_rank,
                    device_id=identity.device_id, device_target=device,
                    coords=coordinates_of(rank, config, world), groups=groups_of(rank, config, world),
                    config=config, exec_mode=mode, exec_mode_source=mode_source)
    _report(info)
    return info


def choose_exec_mode(asked: Union[ExecMode, str, None], debug: bool) -> Tuple[ExecMode, str]:
    """The execution mode and who chose it: ``--debug`` wins, then ``asked``, else GRAPH."""
    if debug:
        return ExecMode.PYNATIVE, "--debug"
    if asked is None:
        return ExecMode.GRAPH, "parallel.init()"
    try:
        mode = ExecMode(asked.lower() if isinstance(asked, str) else asked)
    except ValueError:
        raise ValueError(f"parallel.init(exec_mode={asked!r}): expected 'graph' or 'pynative'") from None
    return mode, f"parallel.init(exec_mode={mode.value!r})"


def config_from_environ(environ: Mapping[str, str]) -> ParallelConfig:
    """The job's ``ParallelConfig`` as the launcher passed it; plain data parallelism if it did not."""
    text = environ.get(contract.PARALLEL, "").strip()
    if text:
        return ParallelConfig.from_json(text)
    seed = environ.get(contract.SEED, "").strip()
    return ParallelConfig(seed=int(seed)) if seed else ParallelConfig()


def select_device(kind: str) -> DeviceTarget:
    """``npu`` -> Ascend, ``cpu`` -> CPU; empty: Ascend if MindSpore's Ascend plugin loaded, else CPU."""
    if not kind:
        # MindSpore picks its default target from the plugins that load; without CANN that is CPU.
        default = ms.get_context("device_target")
        return DeviceTarget.ASCEND if default == DeviceTarget.ASCEND.value else DeviceTarget.CPU
    try:
        return _DEVICE_KINDS[kind.lower()]
    except KeyError:
        raise ValueError(f"{contract.DEVICE_KIND}={kind!r}: expected npu or cpu") from None


def check_supported(config: ParallelConfig, device: DeviceTarget) -> None:
    """Raise ``NeedsAscendError`` for model, pipeline or semi/auto parallelism on CPU.

    MindSpore would otherwise fail later, at graph compilation, with a C++ stack trace
    ("Invalid communication backend: CPU for semi_auto_parallel/auto_parallel mode").
    """
    if device is DeviceTarget.CPU and config.needs_ascend:
        raise NeedsAscendError(
            f"parallel mode {config.mode.value} with dp={config.dp} mp={config.mp} pp={config.pp} "
            f"needs Ascend: MindSpore runs semi/auto parallel, model parallelism and pipelines only "
            f"on Ascend (or GPU), and this rank's device is CPU; on CPU use mode data with mp=1 pp=1")


def apply_parallel_context(config: ParallelConfig, world: int, rank: int) -> None:
    """Set MindSpore's auto-parallel context for ``config`` (resolved) on ``rank`` of ``world``.

    Needs no communication init, so the result can be read back with
    ``mindspore.get_auto_parallel_context`` on any machine.
    """
    settings = {
        "parallel_mode": config.mode.mindspore_name,
        "device_num": world,
        "global_rank": rank,
        "gradients_mean": config.gradients_mean,
        "enable_parallel_optimizer": config.optimizer_shard,
    }
    if config.mode is not ParallelMode.DATA:
        settings.update(full_batch=config.full_batch, pipeline_stages=config.pp)
    ms.set_auto_parallel_context(**settings)


def _joins_cluster(identity: contract.RankIdentity, environ: Mapping[str, str]) -> bool:
    if identity.debug:
        return False
    return bool(environ.get(contract.MS_ROLE)) or identity.world_size > 1


def _init_communication() -> Tuple[int, int]:
    from mindspore import communication

    communication.init()
    return communication.get_rank(), communication.get_group_size()


def _set_device(device: DeviceTarget, device_id: int, mode: ExecMode) -> None:
    ms.set_context(mode=ms.GRAPH_MODE if mode is ExecMode.GRAPH else ms.PYNATIVE_MODE)
    if not hasattr(ms, "set_device"):  # MindSpore < 2.5
        ms.set_context(device_target=device.value, device_id=device_id)
    elif device is DeviceTarget.ASCEND:
        ms.set_device(device.value, device_id)
    else:
        ms.set_device(device.value)


def _nnodes(environ: Mapping[str, str]) -> int:
    text = environ.get(contract.NNODES, "").strip()
    return int(text) if text else 1


def _report(info: RankInfo) -> None:
    events.emit(contract.EVENT_LAYOUT, world_size=info.world_size, local_rank=info.local_rank,
                device_target=info.device_target.value, mode=info.config.mode.value,
                exec_mode=info.exec_mode.value,
                dp=info.config.dp, mp=info.config.mp, pp=info.config.pp,
                dp_index=info.coords.dp_index, mp_index=info.coords.mp_index,
                pp_stage=info.coords.pp_stage)
