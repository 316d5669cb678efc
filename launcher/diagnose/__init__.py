"""What went wrong, in Ascend's terms: a knowledge base of CANN, HCCL, driver, MindSpore and
torch_npu faults (``faults.yaml``), matched against the logs of a failed job (``diagnose_job``,
at the end of every failed attempt) or any log files (``diagnose_paths``, ``npu-launch
diagnose``)."""
from launcher.diagnose.job import LIKELY_CAUSE, diagnose_attempt, diagnosed, diagnosis_last, warm_up
from launcher.diagnose.knowledge import Fault, Knowledge, load
from launcher.diagnose.run import diagnose_files, diagnose_paths
from launcher.diagnose.scan import Hit, Unreadable, scan_file
from launcher.diagnose.verdict import Diagnosis, Finding, decide

__all__ = ["LIKELY_CAUSE", "Diagnosis", "Fault", "Finding", "Hit", "Knowledge", "Unreadable",
           "decide", "diagnose_attempt", "diagnose_files", "diagnose_paths", "diagnosed",
           "diagnosis_last", "load", "scan_file", "warm_up"]
