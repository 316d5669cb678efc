"""What npu-launch adds to every rank without the user writing a line (via ``_boot``).

* An error report: an uncaught exception writes ``{rank, host, pid, exception, message,
  traceback, timestamp}`` as JSON to ``$NPU_LAUNCH_ERROR_FILE`` as Python prints it (MindSpore's
  graph compilation puts Python's default excepthook back: the hook is restored after it, and
  an exit handler writes the report of an exception the hook missed).
* A parent watch: the rank is killed by the kernel when its launcher dies, even by SIGKILL.
* Start-up events: ``started`` at boot, ``framework`` as the rank begins importing MindSpore or
  torch (a MindSpore one starts the job's scheduler: a torch job runs none), and ``initialised``
  when MindSpore's communication ``init()`` returns, which is how the launcher tells a rank
  stuck before ``init()``.
* Progress events (``parallel.hook.progress``): top-level ``Cell`` calls, dataset batches,
  checkpoint loads, and checkpoint saves and ``Model.eval`` (sections of their own kind);
  torch's ``Module`` calls, ``backward``, collectives and ``DataLoader`` batches: counted for
  the launcher's hang check whatever loop the script runs.
* The framework functions behind both are wrapped by an import hook as their modules load
  (``_MODULE_HOOKS``, ``_TORCH_HOOKS``), so a script pays only for what it imports.
* A stack dump on SIGUSR1 to ``$NPU_LAUNCH_STACK_FILE``, for the launcher's hang check.
* Every thread's Python stack in the rank's log when a fault of its own kills it, and an
  ``exiting`` event as the exit handlers begin (``parallel.hook.ending``).
* A save on preemption for ``Model.train``/``fit`` with a ``ModelCheckpoint``
  (``parallel.hook.model_train``); each checkpoint file the script saves told as it is complete, and
  a resume from a mid-epoch save made exact (``parallel.hook.script_saves``, ``parallel.hook.mid_epoch``).
* A short wait for the scheduler's port before ``init()`` connects: MindSpore retries a refused
  registration only every 3-5 s, so connecting too early costs seconds.

Nothing here imports MindSpore.
"""
from __future__ import annotations

import atexit
import ctypes
import faulthandler
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import signal
import socket
import sys
import threading
import time
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

from parallel import contract, events
from parallel.hook import ending, error_report, progress, spare

_PR_SET_PDEATHSIG = 1


def install() -> None:
    """Install every hook whose variable the launcher set; a no-op outside npu-launch, and in
    the processes a rank starts (a subprocess, a multiprocessing worker: not ranks)."""
    if not events.in_the_rank():
        return
    warm = _stand_by() if contract.SPARE in os.environ else None
    if contract.EVENTS_FILE in os.environ or contract.ERROR_FILE in os.environ:
        os.environ[contract.RANK_PID] = str(os.getpid())
    if contract.PARENT_PID in os.environ:
        _die_with_parent(int(os.environ[contract.PARENT_PID]))
    if contract.ERROR_FILE in os.environ:
        sys.excepthook = error_report.reporting_excepthook(sys.excepthook,
                                                            os.environ[contract.ERROR_FILE])
        atexit.register(error_report.report_uncaught)
        ending.install(contract.EVENTS_FILE in os.environ)
    if contract.STACK_FILE in os.environ:
        _dump_stack_on_request(os.environ[contract.STACK_FILE])
    if contract.EVENTS_FILE in os.environ:
        events.emit(contract.EVENT_STARTED, role=os.environ.get(contract.MS_ROLE, ""),
                    main_thread=hex(threading.main_thread().ident or 0),
                    process_start=process_start() if warm is None else time.time())
        if warm is None:
            sys.meta_path.insert(0, _PatchingFinder(_hooks()))
        sys.meta_path.insert(0, _FrameworkFinder(set(contract.FRAMEWORKS) - {warm}))
        if warm is not None:
            events.emit(contract.EVENT_FRAMEWORK, name=warm, kept=True, warm=True)
    spare.note_start()


def _hooks() -> dict[str, Callable[[Any], None]]:
    """The framework functions to wrap: only ``init()`` unless hang detection counts progress."""
    if os.environ.get(contract.PROGRESS) == "1":
        return {**_MODULE_HOOKS, **_TORCH_HOOKS}
    return {**_INIT_HOOK, **_TORCH_INIT_HOOK}


def _stand_by() -> str:
    """A warm spare (``parallel.hook.spare``): the parent watch, the wrappers, the framework
    imported, then the wait for the go; returns the framework, once this is a rank."""
    framework = os.environ[contract.SPARE]
    if contract.PARENT_PID in os.environ:
        _die_with_parent(int(os.environ[contract.PARENT_PID]))
    sys.meta_path.insert(0, _PatchingFinder(_hooks()))
    spare.wait(framework)
    api = sys.modules.get("mindspore.graph.api")
    if api is not None:
        spare.compile_key_at_first_compile(api)
    return framework


def process_start() -> Optional[float]:
    """When the kernel started this process (seconds since the epoch, to its 10 ms tick), from
    ``/proc``; None where there is no ``/proc``."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def run_shadowed_sitecustomize(boot_file: str) -> None:
    """Run the ``sitecustomize`` that ours hides on ``sys.path``, if there is one."""
    boot_dir = os.path.dirname(os.path.abspath(boot_file))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != boot_dir]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _dump_stack_on_request(path: str) -> None:
    """SIGUSR1 writes every thread's Python stack to ``path`` (the launcher's hang check)."""
    global _stack_file
    _stack_file = open(path, "a")  # kept open: faulthandler writes to its descriptor
    faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True)


_stack_file = None


def _die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the launcher's teardown still covers us
        return
    # The parent may have died before prctl took effect.
    if os.getppid() != parent_pid:
        os._exit(128 + signal.SIGKILL)


def _keeping_excepthook(real: Callable[..., Any]) -> Callable[..., Any]:
    """``real`` (MindSpore's graph compilation), with ``sys.excepthook`` as it was before: on
    CPU, compiling a first graph puts back Python's default hook, and with it goes the rank's
    error report (and MindSpore's own exit handler, chained behind it)."""
    def compile(*args: Any, **kwargs: Any) -> Any:
        before = sys.excepthook
        try:
            return real(*args, **kwargs)
        finally:
            if sys.excepthook is sys.__excepthook__ and before is not sys.__excepthook__:
                sys.excepthook = before
    return functools.update_wrapper(compile, real)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Patches each module of ``hooks`` (name -> patch) right after it executes, before any
    other module can bind its names; leaves ``sys.meta_path`` once every one was seen."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]]) -> None:
        self._hooks = hooks

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        patch = self._hooks.pop(fullname, None)
        if patch is None:
            return None
        if not self._hooks:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the next finder: ours no longer knows it
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


class _FrameworkFinder(importlib.abc.MetaPathFinder):
    """Tells the launcher, once per framework, that the rank begins importing it (before the
    import's seconds are spent: MindSpore's scheduler starts meanwhile); finds nothing itself."""

    def __init__(self, names: set[str]) -> None:
        self._names = names

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> None:
        if fullname not in self._names:
            return None
        self._names.discard(fullname)
        if not self._names:
            sys.meta_path.remove(self)
        kept = spare.kept(fullname)
        if fullname == "torch":
            _one_thread_per_rank(os.environ)
        events.emit(contract.EVENT_FRAMEWORK, name=fullname, kept=kept)
        return None


def _one_thread_per_rank(environ: "os._Environ[str]") -> None:
    """torchrun's default: with several ranks on the node and no ``OMP_NUM_THREADS`` of the
    user's, one OpenMP thread per rank (set before torch loads its OpenMP runtime)."""
    try:
        local_world = int(environ.get(contract.LOCAL_WORLD_SIZE, "1"))
    except ValueError:
        return
    if local_world > 1 and contract.OMP_NUM_THREADS not in environ:
        environ[contract.OMP_NUM_THREADS] = "1"


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[Any], None]) -> None:
        self._inner = inner
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            self._patch(module)
        except AttributeError:  # another MindSpore's layout: the script runs unobserved, as is
            pass


def _patch_comm(module: Any) -> None:
    module.init = _reporting_init(module.init)


def _patch_cell(module: Any) -> None:
    module.Cell.__call__ = progress.counting_call(module.Cell.__call__)


def _patch_iterators(module: Any) -> None:
    module.Iterator.__next__ = progress.counting_next(module.Iterator.__next__)


def _patch_serialization(module: Any) -> None:
    _patch_script_saves(module)
    for name in ("load_checkpoint", "load_param_into_net"):
        if hasattr(module, name):
            setattr(module, name, progress.counting_load(getattr(module, name)))
    _patch_saves(module)


def _patch_saves(module: Any) -> None:
    module.save_checkpoint = progress.in_section(contract.SECTION_SAVE, module.save_checkpoint)


def _patch_script_saves(module: Any) -> None:
    """Each file the script saves told as it is complete; the file it loaded remembered."""
    from parallel.hook import script_saves

    module.save_checkpoint = script_saves.reporting_save(module.save_checkpoint)
    module.load_checkpoint = script_saves.recording_load(module.load_checkpoint)


def _patch_model_train(module: Any) -> None:
    from parallel.hook import model_train  # here: not every rank's boot pays for it

    module.Model.train = model_train.stopping_train(module.Model.train)
    module.Model.fit = model_train.stopping_train(module.Model.fit)


def _patch_model(module: Any) -> None:
    _patch_model_train(module)
    module.Model.eval = progress.in_section(contract.SECTION_EVAL, module.Model.eval)


def _patch_module_call(module: Any) -> None:
    module.Module.__call__ = progress.counting_call(module.Module.__call__)


def _patch_backward(module: Any) -> None:
    module.Tensor.backward = progress.counting_call(module.Tensor.backward)


def _patch_loader(module: Any) -> None:
    iterator = module._BaseDataLoaderIter
    iterator.__next__ = progress.counting_next(iterator.__next__)


_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
                "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
                "barrier", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter",
                "send", "recv", "monitored_barrier")


def _patch_torch_init(module: Any) -> None:
    """``torch.distributed.init_process_group``, before ``torch.distributed`` re-exports it."""
    module.init_process_group = _reporting_init(module.init_process_group, exec_mode=False)


def _patch_c10d(module: Any) -> None:
    """``init_process_group`` and the collectives, before ``torch.distributed`` re-exports them."""
    _patch_torch_init(module)
    for name in _COLLECTIVES:
        if hasattr(module, name):
            setattr(module, name, progress.counting_call(getattr(module, name)))


def _patch_graph_api(module: Any) -> None:
    executor = module._CellGraphExecutor
    executor.compile = _keeping_excepthook(executor.compile)


def _patch_graph_api_timed(module: Any) -> None:
    """``_patch_graph_api``, and each graph compilation (a ``Cell``'s, a ``@jit`` function's)
    told to the launcher: the compile grace is what MindSpore does, not a count of calls."""
    _patch_graph_api(module)
    for executor in (module._CellGraphExecutor, module._JitExecutor):
        executor.compile = progress.compiling(executor.compile)
        executor._set_compile_cache_dep_files = progress.compile_begins(
            executor._set_compile_cache_dep_files)


_INIT_HOOK: dict[str, Callable[[Any], None]] = {
    "mindspore.communication.management": _patch_comm,
    "mindspore.graph.api": _patch_graph_api,
    "mindspore.train.model": _patch_model_train,
    "mindspore.train.serialization": _patch_script_saves,
}
_MODULE_HOOKS: dict[str, Callable[[Any], None]] = {
    **_INIT_HOOK,
    "mindspore.graph.api": _patch_graph_api_timed,
    "mindspore.nn.cell": _patch_cell,
    "mindspore.dataset.engine.iterators": _patch_iterators,
    "mindspore.train.serialization": _patch_serialization,
    "mindspore.train.model": _patch_model,
}


_TORCH_HOOKS: dict[str, Callable[[Any], None]] = {
    "torch.nn.modules.module": _patch_module_call,
    "torch._tensor": _patch_backward,
    "torch.utils.data.dataloader": _patch_loader,
    "torch.distributed.distributed_c10d": _patch_c10d,
}
"""torch's counterparts of ``_MODULE_HOOKS``: its ``init_process_group`` and progress."""
_TORCH_INIT_HOOK: dict[str, Callable[[Any], None]] = {
    "torch.distributed.distributed_c10d": _patch_torch_init,
}


def _reporting_init(real_init: Callable[..., Any], exec_mode: bool = True) -> Callable[..., Any]:
    """MindSpore's communication ``init()`` (``exec_mode``: its execution mode is told too) or
    torch's ``init_process_group``, telling the launcher when it begins and returns."""
    def init(*args: Any, **kwargs: Any) -> Any:
        events.emit(contract.EVENT_INIT_STARTED)
        if exec_mode and os.environ.get(contract.MS_ROLE) == contract.ROLE_WORKER:
            wait_for_scheduler(os.environ)
        result = real_init(*args, **kwargs)
        if contract.ERROR_FILE in os.environ:
            atexit.register(error_report.report_uncaught)  # again: before MindSpore's own exit handlers
        ending.again_after_init()
        events.emit(contract.EVENT_INITIALISED, **({"exec_mode": _exec_mode()} if exec_mode else {}))
        return result
    return functools.update_wrapper(init, real_init)


def _exec_mode() -> str:
    """``graph`` or ``pynative``: the mode MindSpore's context is in now (MindSpore is loaded)."""
    import mindspore

    return "graph" if mindspore.get_context("mode") == mindspore.GRAPH_MODE else "pynative"


_FAST_POLL_S = 5.0


def wait_for_scheduler(environ: "os._Environ[str] | dict[str, str]") -> None:
    """Block until the scheduler accepts TCP connections (the launcher bounds the wait)."""
    if environ.get(contract.WAIT_FOR_SCHEDULER) != "1":
        return
    address = (environ[contract.MS_SCHED_HOST], int(environ[contract.MS_SCHED_PORT]))
    since = time.monotonic()
    while True:
        try:
            socket.create_connection(address, timeout=1.0).close()
            return
        except OSError:  # every 1 ms while a scheduler is due (BENCHMARKS.md, stop 38), then 20
            time.sleep(0.001 if time.monotonic() - since < _FAST_POLL_S else 0.02)
