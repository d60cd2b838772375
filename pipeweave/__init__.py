"""pipeweave: GPU performance prediction for LLM inference (analytical features + learned efficiency)."""
