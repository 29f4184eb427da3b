import sys

from jaxdl.cli import main

sys.exit(main())
