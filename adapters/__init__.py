"""Engines behind one protocol (`adapters.base.Engine`), registered by CLI name."""
