"""What runs inside every rank without the user asking: the rank hook and what it installs.

``parallel/_boot/sitecustomize.py`` imports ``parallel.hook.rank_hook`` as every process
npu-launch starts boots; the hook reports a rank's start, errors (``error_report``), ending
(``ending``) and progress (``progress``), makes a warm spare of it (``spare``), and wraps
MindSpore's ``Model.train`` (``model_train``, ``mid_epoch``) and its checkpoint saves and loads
(``script_saves``). ``preemption`` (a stop signal that reaches the rank) is shared with
``parallel.trainer``. Standard library only, as the boot of every rank must be: this
``__init__`` imports nothing.
"""
