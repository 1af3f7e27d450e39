from llmswap.cli.main import main

raise SystemExit(main())
