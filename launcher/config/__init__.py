"""What the user gives, checked before anything starts: options (``launch_config``) and config
files (``config_file``), hostfiles, ``--env-file``, devices, the script, msrun's spelling
(``msrun_args``, ``msrun_values``, ``msrun_compat``) and which framework the ranks use
(``frameworks``)."""
