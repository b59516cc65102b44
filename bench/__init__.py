"""Benchmarks that print ratios against a plain forward pass; run as `python -m bench.<name>`, never as tests."""
