"""Analytical pipe-demand models of LLM inference kernels (METHOD.md §3)."""
