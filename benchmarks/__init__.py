"""Benchmarks: agent-trace generator, SWE-agent replayer, cache-breaking variants, runner, reports.

Entry point: ``agentserve bench ...`` (or ``python benchmarks/run.py ...``); see benchmarks/README.md.
"""
