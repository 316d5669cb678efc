"""What went wrong, in Ascend's terms: a knowledge base of CANN, HCCL, driver, MindSpore and
torch_npu faults (``faults.yaml``), matched against the logs of a failed job (``diagnose_job``,
at the end of every failed attempt) or any log files (``diagnose_paths``, ``npu-launch
diagnose``)."""
from launcher.diagnose.knowledge import Fault, Knowledge, load
from launcher.diagnose.run import diagnose_files, diagnose_paths
from launcher.diagnose.scan import Hit, Unreadable, scan_file
from launcher.diagnose.verdict import Diagnosis, Finding, decide

__all__ = ["Diagnosis", "Fault", "Finding", "Hit", "Knowledge", "Unreadable", "decide",
           "diagnose_files", "diagnose_paths", "load", "scan_file"]
