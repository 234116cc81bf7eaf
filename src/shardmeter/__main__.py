from shardmeter.cli import main

raise SystemExit(main())
