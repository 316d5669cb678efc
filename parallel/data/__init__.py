"""Every rank's input: sharded, batched MindSpore datasets, and MindRecord files to read.

* ``readers``: ``sharded_dataset`` (MindRecord, image folders, NumPy arrays, random-access
  Python sources), its ``ShardPlan`` and sampler, ``kept_global_batch``.
* ``mindrecord``: ``write_mindrecord`` and ``write_mindrecord_from_folder``.

Imported by user scripts (``scripts/train_digits.py``, ``scripts/prepare_data.py``) as
``parallel.data``; importing it imports ``mindspore.dataset``.
"""
from parallel.data.mindrecord import write_mindrecord, write_mindrecord_from_folder
from parallel.data.readers import (
    EpochShardSampler,
    ShardPlan,
    SourceKind,
    kept_global_batch,
    sharded_dataset,
    source_kind,
)

__all__ = ["sharded_dataset", "ShardPlan", "SourceKind", "source_kind", "EpochShardSampler",
           "kept_global_batch", "write_mindrecord", "write_mindrecord_from_folder"]
