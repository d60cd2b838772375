import sys

from pipeweave.cli import run_cli
from pipeweave.paper.reproduce import main

sys.exit(run_cli(main))
