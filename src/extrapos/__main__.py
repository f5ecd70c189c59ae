from extrapos.cli import main

raise SystemExit(main())
