from heloco.cli import main

raise SystemExit(main())
