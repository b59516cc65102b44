"""Helpers for user interfaces that serve untrusted clients. No dependency on any UI toolkit."""
