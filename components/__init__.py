"""Thin Pulumi adapters: one ComponentResource per file, wired by `deployment.deploy`."""
