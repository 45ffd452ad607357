import sys

from clef_runtime.cli import main

sys.exit(main())
