from mhainterp.cli import main

raise SystemExit(main())
