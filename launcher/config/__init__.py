"""What the user gives, checked before anything starts: options and config files
(``launch_config``), hostfiles, ``--env-file``, devices, the script, msrun's spelling
(``msrun_compat``, ``msrun_values``) and which framework the ranks use (``frameworks``)."""
