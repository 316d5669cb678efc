"""The commands: ``npu-launch`` and its subcommands (``main``), the run options and the
``--config`` file made into a config (``run_config``), their grouped help (``help_groups``),
``npu-launch rank-table`` (``rank_table``, ``rank_table_cluster``), and what they print when
standard output is closed or full (``standard_output``). The one place a refusal becomes a
message and an exit code."""


def entry() -> None:
    """The ``npu-launch`` command. Ctrl-C while it still loads its modules (about 0.3 s) ends it
    as Ctrl-C later does before anything started, exit 130, not with a Python traceback."""
    try:
        from launcher.cli.main import main
        from launcher.run.strays import become_subreaper
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    become_subreaper()
    main()
