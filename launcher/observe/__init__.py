"""What a person sees and what a job leaves: the monitor's state (``monitor``,
``job_state``), the status table (``status_display``), start-up phases (``startup``), the files
in the log directory (summary.json's records: ``summary_records``; read back: ``job_files``,
``metrics_records``, with the readers of untrusted values in ``read_values``), ``npu-launch
report`` (``report``) and the log directory's lock (``joblock``)."""
