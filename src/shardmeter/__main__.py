"""`python -m shardmeter`: the `shardmeter` command line."""

from shardmeter.cli import main

raise SystemExit(main())
