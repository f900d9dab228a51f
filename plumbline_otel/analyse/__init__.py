"""Analyses: statistics and alignment."""
