"""Markdown from sweeps: the report of one or more sweeps, a results folder's index and pages."""
