"""The paper's evidence on our data: ``python3 -m pipeweave.paper`` writes docs/PAPER.md (see ``reproduce``)."""
