"""Analytical pipe-demand models of LLM inference kernels (docs/METHOD.md §3)."""
