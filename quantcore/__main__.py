import sys

from quantcore.cli.main import main

sys.exit(main())
