from llmswap.cli import main

raise SystemExit(main())
