"""Dialect adapters: other APIs' request/response shapes onto the one chat pipeline."""
