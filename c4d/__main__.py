import sys

from c4d.cli import main

sys.exit(main())
