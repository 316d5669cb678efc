"""Loaded at start-up by every process npu-launch starts: the launcher puts this folder first on
``PYTHONPATH``. It installs the rank hook (error reports, events, parent watch) so that user
scripts need no decorator, then runs any ``sitecustomize`` this one shadows."""


def _boot() -> None:
    try:
        from parallel import rank_hook
    except ImportError:  # a Python without npu-launch installed: run the script unchanged
        return
    rank_hook.install()
    rank_hook.run_shadowed_sitecustomize(__file__)


_boot()
