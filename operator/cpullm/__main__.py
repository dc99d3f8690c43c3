from cpullm.cli import main

raise SystemExit(main())
