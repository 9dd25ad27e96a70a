"""`python -m workers.router --tables FILE --listen HOST:PORT [--ready-file PATH]`: a router on a tables file."""
import sys

from workers.router.server import main

sys.exit(main())
