"""What a person sees and what a job leaves: the monitor's state (``monitor``,
``job_state``), the status table (``status_display``), start-up phases (``startup``), the files
in the log directory (``job_files``), ``npu-launch report`` (``report``) and the log
directory's lock (``joblock``)."""
